"""Scheduler queues: Kueue ClusterQueues, Slurm partitions and Kubernetes namespaces, and their series."""
