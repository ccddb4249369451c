"""node_exporter's disk, file system and NFS mountstats series (collector/diskstats_linux.go,
filesystem_common.go, mountstats_linux.go): storage's entry in the exporter mapping table
(fleet.exporters), registered from fleet/storage/plugins.py. Each is a node series of a host's
disk or mount (fleet.telemetry.series.NodeSeries: collector, quantity stored, is a counter), kept
by storage's parts of the node-series writer."""

from __future__ import annotations

from fleet.exporters import NODE, ExporterMapping
from fleet.storage.store import storage_parts
from fleet.telemetry.series import NodeSeries

STORAGE_SERIES: dict[str, NodeSeries] = {
    "node_disk_io_time_seconds_total": NodeSeries("disk", "io_time_seconds", True),
    "node_disk_read_bytes_total": NodeSeries("disk", "read_bytes", True),
    "node_disk_written_bytes_total": NodeSeries("disk", "written_bytes", True),
    "node_disk_reads_completed_total": NodeSeries("disk", "reads", True),
    "node_disk_writes_completed_total": NodeSeries("disk", "writes", True),
    "node_filesystem_avail_bytes": NodeSeries("filesystem", "avail_bytes", False),
    "node_filesystem_size_bytes": NodeSeries("filesystem", "size_bytes", False),
    # mountstats_linux.go (NFS): bytes moved to and from the server (not the read()/write() calls'
    # bytes, which page-cache hits inflate), and the READ operations and their summed RTT.
    "node_mountstats_nfs_total_read_bytes_total": NodeSeries("mountstats", "nfs_read_bytes", True),
    "node_mountstats_nfs_total_write_bytes_total": NodeSeries("mountstats", "nfs_write_bytes", True),
    "node_mountstats_nfs_operations_requests_total": NodeSeries("mountstats", "nfs_read_ops", True),
    "node_mountstats_nfs_operations_response_time_seconds_total": NodeSeries(
        "mountstats", "nfs_read_response_seconds", True
    ),
}

MAPPINGS = (
    ExporterMapping("node_exporter (storage)", NODE, storage_parts, families=STORAGE_SERIES, kinds=("auto", "node")),
)
