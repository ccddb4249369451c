"""The fabric room: InfiniBand, RoCE and Ethernet port series from node_exporter."""
