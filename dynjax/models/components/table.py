"""A model's parameters as rows ``(path, shape, logical axes)``: one table gives the params
pytree, its shardings and its counts, so a port writes its shapes once."""
from __future__ import annotations


def tree(rows, leaf) -> dict:
    """The params pytree with ``leaf(path, shape)`` at every row's path; the integer keys
    under ``"layers"`` become a list (one entry per layer, in order)."""
    params: dict = {}
    for path, shape, _ in rows:
        node = params
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = leaf(path, shape)
    if "layers" in params:
        params["layers"] = [params["layers"][i] for i in range(len(params["layers"]))]
    return params
