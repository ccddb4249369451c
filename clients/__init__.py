"""Programs that run on GPU nodes and inside training images, standard library only (the NVML agent
also uses requests): the ``goodput-agent`` NVML agent and the training client. No Django here."""
