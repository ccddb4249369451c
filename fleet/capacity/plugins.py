"""What capacity plugs in: the overview tile. (What plugs into capacity's pages and API, the
scheduler's queues and cost's money, is declared in those rooms' plugins.py.)"""

from console import overview
from fleet.capacity.read import tables

overview.register_section(
    overview.Section(name="capacity", template="capacity/_overview.html", context=tables.overview_tile, order=28)
)
