"""What the fleet, GPU and node pages and their APIs read: fleet and site figures, series and the GPU
and node pushes (figures), the GPU table and GPU health (gpu_list), and the fleet summary every
reader shares with its live topics (fleet_summary)."""
