"""Training jobs, their event streams and their goodput accounts.

A job's events (allocated, started, step, checkpoint saved, failed, ...) are the record; the job
row carries the few facts the detectors and pages read on every cycle (state, last step, last
checkpoint), kept current by the event writer (fleet.training.events); the hourly accounts are
the goodput accounting of those events (fleet.training.goodput), refreshed by a task, so pages
over 7 days read a few thousand rows rather than every step.
"""

from __future__ import annotations

from django.db import models

from fleet.choices import JobEventKind, JobState, PriorityTier, Scheduler, TrainingFramework

# The states in which a job holds its GPUs (a failed attempt holds them until released or restarted).
HOLDING_STATES = (JobState.ALLOCATED, JobState.RUNNING, JobState.FAILED)


class JobQuerySet(models.QuerySet["Job"]):
    def holding(self) -> JobQuerySet:
        """Jobs that hold GPUs now."""
        return self.filter(state__in=HOLDING_STATES)

    def running(self) -> JobQuerySet:
        return self.filter(state=JobState.RUNNING)


class Job(models.Model):
    site = models.ForeignKey("fleet.Site", on_delete=models.PROTECT, related_name="jobs")
    cluster = models.CharField(max_length=100, blank=True, help_text="The scheduler's cluster name")
    name = models.CharField(max_length=200)
    team = models.CharField(max_length=100)
    framework = models.CharField(max_length=16, choices=TrainingFramework.choices, default=TrainingFramework.PYTORCH)
    gang_size = models.PositiveIntegerField(help_text="GPUs the job holds while allocated")
    nodes = models.ManyToManyField("fleet.Node", blank=True, related_name="jobs")
    gpus = models.ManyToManyField("fleet.Gpu", blank=True, related_name="jobs")
    priority_tier = models.CharField(max_length=16, choices=PriorityTier.choices, default=PriorityTier.ON_DEMAND)
    checkpoint_interval_s = models.PositiveIntegerField(
        null=True, blank=True, help_text="Planned seconds between checkpoints"
    )
    scheduler = models.CharField(max_length=16, choices=Scheduler.choices, default=Scheduler.OTHER)
    scheduler_id = models.CharField(max_length=200, help_text="Workload, PodGroup or Slurm job id")
    created_at = models.DateTimeField(auto_now_add=True)

    # Kept current by the event writer, in the batch's transaction.
    state = models.CharField(max_length=16, choices=JobState.choices, default=JobState.PENDING)
    first_allocated_at = models.DateTimeField(null=True, blank=True)
    allocated_since = models.DateTimeField(null=True, blank=True, help_text="Start of the current allocation")
    progress_since = models.DateTimeField(
        null=True,
        blank=True,
        help_text="Latest allocation, start or restore",
    )
    ended_at = models.DateTimeField(null=True, blank=True)
    last_event_at = models.DateTimeField(null=True, blank=True)
    last_step = models.BigIntegerField(null=True, blank=True)
    last_step_at = models.DateTimeField(null=True, blank=True)
    last_step_time_s = models.FloatField(null=True, blank=True)
    last_checkpoint_at = models.DateTimeField(null=True, blank=True)
    last_checkpoint_step = models.BigIntegerField(null=True, blank=True)
    failures = models.PositiveIntegerField(default=0)
    events_seen = models.BigIntegerField(default=0, help_text="Events stored so far (the next event's seq)")
    accounts_dirty_at = models.DateTimeField(
        null=True, blank=True, help_text="Events arrived since the accounts were last refreshed"
    )

    objects = JobQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "name"]
        constraints = [
            models.UniqueConstraint(fields=["site", "scheduler", "scheduler_id"], name="job_unique_scheduler_id"),
        ]
        indexes = [models.Index(fields=["state"], name="job_state_idx")]

    def __str__(self) -> str:
        return f"{self.name} ({self.team}, {self.gang_size} GPUs)"

    @property
    def holds_gpus(self) -> bool:
        return self.state in HOLDING_STATES


class JobEvent(models.Model):
    """One event of one job. (job, event_id) is the key: a retried event is stored once.

    Steps are most of the rows, so the table is lean: one row per event, numbers in columns, no
    JSON; the writer COPYs a batch in.
    """

    pk = models.CompositePrimaryKey("job", "event_id")
    job = models.ForeignKey("fleet.Job", on_delete=models.CASCADE, related_name="events")
    event_id = models.CharField(max_length=100)
    # Arrival order within the job: events of one timestamp (allocated and started in the same
    # second) are read back in the order they were sent.
    seq = models.BigIntegerField()
    ts = models.DateTimeField()
    kind = models.CharField(max_length=24, choices=JobEventKind.choices)
    step = models.BigIntegerField(null=True, help_text="The step reached, saved, or restored from")
    tokens = models.BigIntegerField(null=True, help_text="step: tokens processed by this step")
    step_time_s = models.FloatField(null=True, help_text="step: wall seconds of the step, data wait included")
    data_wait_s = models.FloatField(null=True, help_text="step: seconds of the step spent waiting for input data")
    duration_s = models.FloatField(
        null=True, help_text="checkpoint_saved: seconds the save blocked training; restored: seconds to load"
    )
    bytes = models.BigIntegerField(null=True, help_text="checkpoint_saved: size of the checkpoint")
    reason = models.CharField(max_length=500, blank=True, help_text="failed, preempted: why")
    node = models.CharField(max_length=253, blank=True, help_text="step: the reporting node")

    class Meta:
        db_table = "fleet_jobevent"
        indexes = [
            models.Index(fields=["job", "ts", "seq"], name="jobevent_job_ts_idx"),
            # The job page's live push reads "events after seq N".
            models.Index(fields=["job", "seq"], name="jobevent_job_seq_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.job_id}:{self.event_id} {self.kind} at {self.ts:%Y-%m-%d %H:%M:%S}"


class JobAccount(models.Model):
    """A job's goodput accounting for one hour, in GPU-seconds (gang size x wall seconds).

    The badput columns and productive_s add up to allocated_s exactly. at_risk_s is progress
    since the last checkpoint of a job still running: neither retained nor lost yet.
    """

    job = models.ForeignKey("fleet.Job", on_delete=models.CASCADE, related_name="accounts")
    hour = models.DateTimeField()
    allocated_s = models.FloatField(default=0)
    productive_s = models.FloatField(default=0)
    at_risk_s = models.FloatField(default=0)
    startup_s = models.FloatField(default=0)
    data_stall_s = models.FloatField(default=0)
    checkpoint_save_s = models.FloatField(default=0)
    checkpoint_restore_s = models.FloatField(default=0)
    disruption_s = models.FloatField(default=0)
    hang_s = models.FloatField(default=0)
    idle_s = models.FloatField(default=0)
    steps = models.BigIntegerField(default=0)
    tokens = models.BigIntegerField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["job", "hour"], name="jobaccount_unique_hour")]
        indexes = [models.Index(fields=["hour"], name="jobaccount_hour_idx")]

    def __str__(self) -> str:
        return f"{self.job_id} {self.hour:%Y-%m-%d %H}:00"
