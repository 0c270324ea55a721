"""Writes the hand-made replay fixtures tests/replay/{collective-forward,echo,collective-deadlock}.json
(run from that folder).

The first two are plans `fcp verify --numeric` and `fcp simulate` accept that the replay once
failed: a send forwarding rows a collective brought at the same step, and a rank sending back
rows its receiver owns. The third cannot run to its end (`fcp verify`: Deadlock) and once
stalled the replay until the gloo timeout (bug hunt)."""

import json
def rng(d, s, e): return [d, s, e]
def plan(name, docs, owned, tasks, transfers):
    n = len(owned)
    return {"version": 1, "scheme": {"name": name, "params": {}}, "num_ranks": n, "mask": "full",
            "q_heads": 4, "kv_heads": 2, "congestion_free": False,
            "documents": [{"id": i, "len": n} for i, n in enumerate(docs)],
            "ranks": [{"rank": i, "owned": [owned[i]],
                       "steps": [{"tasks": [{"q": q, "kv": kv} for q, kv in step]} for step in tasks[i]]}
                      for i in range(n)],
            "transfers": transfers}
def kv(src, dst, r, kind="p2p", coll=None, issue=0, due=0):
    t = {"kind": kind, "tensor": "kv", "src": src, "dst": dst, "ranges": [r], "issue_at": issue, "arrive_by": due}
    if coll is not None:
        t["collective"] = coll
    return t
# Collective forward: an all-to-all brings rank i+1 the rows of rank i; rank 1 forwards rank 0's to
# rank 2 at the same step. The rest go from their owners.
R = [rng(0, 10 * i, 10 * i + 10) for i in range(4)]
tasks = [[[(R[i], R[j]) for j in range(4)]] for i in range(4)]
T = [kv(i, (i + 1) % 4, R[i], "all_to_all", 0) for i in range(4)]
T += [kv(1, 2, R[0])] + [kv(i, (i + 2) % 4, R[i]) for i in (1, 2, 3)]
T += [kv((i + 1) % 4, i, R[(i + 1) % 4]) for i in range(4)]
json.dump(plan("collective-forward", [40], R, tasks, T), open("collective-forward.json", "w"), indent=1)
# Echo: rank 1 sends rank 0 back rows it owns (and rank 3 rank 2's), beside the real exchange.
E = [rng(0, 0, 20), rng(0, 20, 40), rng(1, 0, 20), rng(1, 20, 40)]
tasks = [[[(E[0], E[0]), (E[0], E[1])]], [[(E[1], E[1]), (E[1], E[0])]],
         [[(E[2], E[2]), (E[2], E[3])]], [[(E[3], E[3]), (E[3], E[2])]]]
T = [kv(0, 1, E[0]), kv(1, 0, E[1]), kv(1, 0, E[0]), kv(2, 3, E[2]), kv(3, 2, E[3]), kv(3, 2, E[2])]
json.dump(plan("echo", [40, 40], E, tasks, T), open("echo.json", "w"), indent=1)
# Deadlock: collective 0 waits for rank 2, which joins at step 3 and waits at step 2 for rank 1,
# which waits at step 1 for collective 0.
A, B, C = (rng(0, 10 * i, 10 * i + 10) for i in range(3))
tasks = [[[(A, A), (A, B)], [], [], [(A, C)]], [[(B, B)], [(B, A), (B, C)], [], []],
         [[(C, C), (C, A)], [], [(C, B)], []]]
T = [kv(1, 0, B), kv(2, 1, C, due=1), kv(0, 2, A), kv(1, 2, B, issue=2, due=2),
     kv(0, 1, A, "all_to_all", 0, due=1), kv(2, 0, C, "all_to_all", 0, issue=3, due=3)]
json.dump(plan("collective-deadlock", [30], [A, B, C], tasks, T), open("collective-deadlock.json", "w"), indent=1)
# Repeated rows: one step's launch holds several pieces of the same query rows (a causal
# document cut into 16-row tiles, all in step 0), on heads [0, 3) and [3, 4) that split a GQA
# group (K/V expanded per query head); the replay's batched merge must combine them
# (scripts/fcp_exec/step.py).
A, B = rng(0, 0, 48), rng(1, 0, 40)
t = lambda q, k, h=None: dict({"q": q, "kv": k}, **({"heads": h} if h else {}))
tiles = [t(rng(0, 16 * i, 16 * i + 16), rng(0, 16 * j, 16 * j + 16), [0, 3]) for i in range(3) for j in range(i + 1)]
rep = plan("repeat-rows", [48, 40], [A, B], [[[]], [[]]], [])
rep.update(version=2, mask="causal")
rep["ranks"][0]["steps"] = [{"tasks": tiles + [t(A, rng(0, 0, 24), [3, 4])]}, {"tasks": [t(rng(0, 8, 48), rng(0, 24, 48), [3, 4])]}]
rep["ranks"][1]["steps"] = [{"tasks": [t(B, B)]}, {"tasks": []}]
json.dump(rep, open("repeat-rows.json", "w"), indent=1)
