"""Training detectors (hang, data-pipeline starvation, straggler, checkpoint overdue): filled in
by the training detectors work."""
