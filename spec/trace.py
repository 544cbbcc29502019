"""Print a Quint ITF trace of spec/protocol.qnt as a short step-by-step story.

Usage: python3 spec/trace.py TRACE.itf.json

One line per step: the action, then what it changed among the things a reader of a
counterexample looks at (members' shards with their tokens and local leases, the
owner fences, the recorded group, the Redis copies, the last protocol event).
Standard library only; runs without the project's virtualenv.
"""

from __future__ import annotations

import json
import sys
from typing import Any


def plain(v: Any) -> Any:
    """ITF values as Python values (maps as dicts, sets as sorted lists)."""
    if isinstance(v, dict):
        if "#bigint" in v:
            return int(v["#bigint"])
        if "#map" in v:
            return {plain(k): plain(x) for k, x in v["#map"]}
        if "#set" in v:
            return sorted((plain(x) for x in v["#set"]), key=repr)
        if "#tup" in v:
            return tuple(plain(x) for x in v["#tup"])
        if "tag" in v and "value" in v and len(v) == 2:
            inner = plain(v["value"])
            return v["tag"] if inner in ({}, None, ()) else {v["tag"]: inner}
        return {k: plain(x) for k, x in v.items() if not k.startswith("#")}
    if isinstance(v, list):
        return [plain(x) for x in v]
    return v


def members(w: dict[str, Any]) -> str:
    parts = []
    for m, local in sorted(w["members"].items()):
        held = ",".join(
            f"{s}@{h['token']}{'(drain)' if h['draining'] else ''}"
            for s, h in sorted(local["held"].items())
        )
        flags = "".join(
            f for f, on in (("paused ", local["paused"]), ("left ", local["left"])) if on
        )
        parts.append(
            f"{m}[{flags}e{local['epoch']} mv{local['mv']} {{{held}}} lease<{local['leaseUntil']}]"
        )
    return " ".join(parts)


def group(c: dict[str, Any]) -> str:
    g = c["group"]
    recs = []
    for m, r in sorted(g["members"].items()):
        assigned = ",".join(f"{s}@{t}" for s, t in sorted(r["assigned"].items()))
        extra = ""
        if r["pendingRevocation"]:
            extra += f" revoking{r['pendingRevocation']}"
        if r["quarantined"]:
            extra += f" quarantined{r['quarantined']}<{r['quarantineUntil']}"
        recs.append(f"{m}:{r['state']} e{r['epoch']} {{{assigned}}}{extra}")
    fences = ",".join(
        f"{s}={f['token']}:{f['member']}" for s, f in sorted(c["fences"].items()) if f["token"]
    )
    epochs = f"e{g['groupEpoch']}/t{g['targetEpoch']}/mv{g['metadataVersion']}"
    return f"group {epochs} [{'; '.join(recs)}] fences[{fences}]"


def event(e: Any) -> str:
    """The last protocol event, in words."""
    if not isinstance(e, dict):
        return ""
    kind, v = next(iter(e.items()))
    if kind == "Answer":
        return f"answered {v['member']}: {v['status']}"
    if kind == "Publish":
        return f"published to shard {v['shard']}" + (
            "" if v["inLayout"] else " (NOT IN THE LAYOUT)"
        )
    grant = f"newest grant {v['grant']['token']}:{v['grant']['member']}"
    lease = "" if v["leaseValid"] else ", lease ended"
    verb = "reads" if kind == "Read" else "handles an entry of"
    return f"{v['member']} {verb} shard {v['shard']} under token {v['token']} ({grant}{lease})"


def main(path: str) -> int:
    with open(path, encoding="utf-8") as f:
        states = json.load(f)["states"]
    previous: dict[str, str] = {}
    for i, state in enumerate(states):
        w = plain(state["w"])
        a = w["act"]
        args = [str(x) for x in (a["who"], a["shard"], a["value"]) if x not in ("", -1)]
        now = f"t={w['now']}" + (
            f" redis={w['now'] + w['clockOffset']}" if w["clockOffset"] else ""
        )
        view = {
            "members": members(w),
            "primary": group(w["primary"]),
            "replica": "replica=primary"
            if w["replica"] == w["primary"]
            else "replica: " + group(w["replica"]),
            "event": event(w["event"]),
        }
        changed = [v for k, v in view.items() if v and previous.get(k) != v]
        lines = [f"{i:3d} {now:>6} {a['name']} {' '.join(args)}"]
        lines += [f"           {line}" for line in changed]
        sys.stdout.write("\n".join(lines) + "\n")
        previous = view
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
