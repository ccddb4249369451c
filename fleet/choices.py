from django.db import models


class Interconnect(models.TextChoices):
    NVLINK = "nvlink", "NVLink / NVSwitch"
    PCIE = "pcie", "PCIe only"
    INFINIBAND = "infiniband", "NVLink + InfiniBand"
    ROCE = "roce", "NVLink + RoCE"
    UNKNOWN = "", "Unknown"


class GpuHealth(models.TextChoices):
    HEALTHY = "healthy", "Healthy"
    WARNING = "warning", "Warning"
    CRITICAL = "critical", "Critical"
    STALE = "stale", "No recent data"


class ServingFramework(models.TextChoices):
    VLLM = "vllm", "vLLM"
    TRITON = "triton", "Triton"
    TGI = "tgi", "Text Generation Inference"
    OTHER = "other", "Other"


class ScrapeKind(models.TextChoices):
    AUTO = "auto", "Detect from the metric names"
    DCGM = "dcgm", "dcgm-exporter"
    VLLM = "vllm", "vLLM"
    TRITON = "triton", "Triton"
    TGI = "tgi", "TGI"
    NODE = "node", "node_exporter"


class ScrapeHealth(models.TextChoices):
    UNKNOWN = "unknown", "Unknown"
    UP = "up", "Up"
    DOWN = "down", "Down"


class TrainingFramework(models.TextChoices):
    PYTORCH = "pytorch", "PyTorch"
    LIGHTNING = "lightning", "PyTorch Lightning"
    HF = "huggingface", "Hugging Face Transformers"
    MEGATRON = "megatron", "Megatron-LM / NeMo"
    DEEPSPEED = "deepspeed", "DeepSpeed"
    JAX = "jax", "JAX"
    OTHER = "other", "Other"


class Scheduler(models.TextChoices):
    KUEUE = "kueue", "Kueue"
    VOLCANO = "volcano", "Volcano"
    SLURM = "slurm", "Slurm"
    OTHER = "other", "Other"


class PriorityTier(models.TextChoices):
    """The capacity tiers a reservation or a job runs in (REFERENCE.md, capacity and quota)."""

    RESERVED = "reserved", "Reserved"
    ON_DEMAND = "on-demand", "On-demand"
    PREEMPTIBLE = "preemptible", "Preemptible"


class JobState(models.TextChoices):
    PENDING = "pending", "Pending"  # registered, no GPUs yet
    ALLOCATED = "allocated", "Allocated"  # GPUs held, program not started
    RUNNING = "running", "Running"
    FAILED = "failed", "Failed"  # the attempt died; GPUs held until released or restarted
    PREEMPTED = "preempted", "Preempted"  # GPUs taken back by the scheduler
    COMPLETED = "completed", "Completed"
    RELEASED = "released", "Released"


class JobEventKind(models.TextChoices):
    ALLOCATED = "allocated", "GPUs allocated"
    STARTED = "started", "Program started"
    STEP = "step", "Training step"
    CHECKPOINT_STARTED = "checkpoint_started", "Checkpoint started"
    CHECKPOINT_SAVED = "checkpoint_saved", "Checkpoint saved"
    RESTORED = "restored", "Restored from a checkpoint"
    FAILED = "failed", "Failed"
    PREEMPTED = "preempted", "Preempted"
    RESUMED = "resumed", "Resumed"
    RELEASED = "released", "GPUs released"
    COMPLETED = "completed", "Completed"


class ClaimKind(models.TextChoices):
    UUID = "uuid", "GPU UUID"
    HOSTNAME = "hostname", "Hostname"


class ClaimResolution(models.TextChoices):
    PENDING = "", "Pending"
    KEPT = "kept", "Kept with the owning site"
    MOVED = "moved", "Moved to the claiming site"


class InterfaceKind(models.TextChoices):
    IB = "ib", "InfiniBand"
    ROCE = "roce", "RoCE"
    ETHERNET = "ethernet", "Ethernet"


class Fabric(models.TextChoices):
    COMPUTE = "compute", "Compute"
    STORAGE = "storage", "Storage"
    MANAGEMENT = "management", "Management"


class MountPurpose(models.TextChoices):
    DATASETS = "datasets", "Datasets"
    CHECKPOINTS = "checkpoints", "Checkpoints"
    OTHER = "other", "Other"


class QueueScheduler(models.TextChoices):
    """The schedulers whose queues the console reads (fleet.scheduler): Kueue's ClusterQueues,
    Slurm's partitions, and Kubernetes namespaces as kube-state-metrics reports them."""

    KUEUE = "kueue", "Kueue"
    SLURM = "slurm", "Slurm"
    KUBERNETES = "kubernetes", "Kubernetes"


class QueueKind(models.TextChoices):
    """What a scheduler queue is (fleet.scheduler.models.SchedulerQueue). A ClusterQueue, a
    partition and a namespace admit work onto a pool's GPUs; a Kueue LocalQueue (named
    ``namespace/name``) feeds a ClusterQueue and a Slurm account spans partitions, so those two
    stand for a team only (TEAM_ONLY_KINDS). ``cluster`` is the blank-named row holding the
    cluster's own series."""

    CLUSTER = "cluster", "Cluster"
    CLUSTER_QUEUE = "clusterqueue", "ClusterQueue"
    LOCAL_QUEUE = "localqueue", "LocalQueue"
    PARTITION = "partition", "Partition"
    ACCOUNT = "account", "Account"
    NAMESPACE = "namespace", "Namespace"


# Queues that stand for a team but take no pool: their work lands through a ClusterQueue or partition.
TEAM_ONLY_KINDS = frozenset({QueueKind.LOCAL_QUEUE, QueueKind.ACCOUNT})
