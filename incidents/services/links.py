"""Links from an incident's labels to the console pages of what it affects, where pages exist.

By URL name only: this app knows no fleet model.
"""

from __future__ import annotations

from typing import Any

from django.urls import NoReverseMatch, reverse

# label -> URL name taking the label's value
LINKABLE = {
    "gpu": "fleet:gpu_detail",
    "UUID": "fleet:gpu_detail",
    "hostname": "fleet:node_detail",
    "node": "fleet:node_detail",
    "job": "training:job_detail",
    "endpoint": "serving:endpoint_detail",
}


def resource_links(labels: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for name, value in sorted(labels.items()):
        url = None
        target = LINKABLE.get(name)
        if target and isinstance(value, str) and value and not (name == "gpu" and value.isdigit()):
            try:
                url = reverse(target, args=[value])
            except NoReverseMatch:
                url = None
        out.append({"name": name, "value": value, "url": url})
    return out
