"""Reading a plan file (docs/plan-format.md) and deriving what each rank runs.

The executor takes the plan exactly as the Rust IR writes it: ranges are `[doc, start, end]`,
head ranges `[h0, h1)` of query heads, transfers name their kind, tensor, collective id and the
steps they are issued at and due by. A transfer with `also_to` receivers (format version 2, an
all-gather listing each shard once) becomes one transfer per receiver here, numbered in plan
order, so everything below sees point-to-point pieces as in version 1. Everything an executor needs is derived here, once, and
identically on every rank, so all ranks agree on message tags and collective order.
"""

import json


class PlanError(Exception):
    """The file is not a plan this executor can run (exit 2)."""


# The longest document a plan may hold (2^32 tokens, as `fcp verify` checks).
MAX_DOC_LEN = 1 << 32


def _check_cover(origin, what, layout, extent):
    """Each document's tokens [0, extent) held by exactly one rank in `layout` (per rank, a
    list of [doc, start, end] ranges)."""
    by_doc = {}
    for rank, ranges in enumerate(layout):
        for (d, s, e) in ranges:
            by_doc.setdefault(d, []).append((s, e, rank))
    for d, n in enumerate(extent):
        at = 0
        for (s, e, rank) in sorted(by_doc.get(d, [])):
            if s != at:
                gap = "held twice" if s < at else "held by no rank"
                raise PlanError(f"{origin}: {what}: tokens of document {d} from {min(s, at)} are {gap}"
                                f" (every token is held by exactly one rank)")
            at = e
        if at != n:
            raise PlanError(f"{origin}: {what}: tokens of document {d} from {at} to {n} are held by no rank"
                            f" (every token is held by exactly one rank)")


def _is_int(x):
    """A JSON integer: Python reads true and false as ints too."""
    return isinstance(x, int) and not isinstance(x, bool)


def _int(x, what):
    """A JSON integer, as fcp's readers take it: a float was truncated (0.5 read as 0) and 1e400
    crashed with a traceback (bug hunt)."""
    if not _is_int(x):
        raise PlanError(f"{what} must be an integer, got {x!r}")
    return x


def _obj(x, what):
    """A JSON object (a task or transfer given as a number crashed with a traceback)."""
    if not isinstance(x, dict):
        raise PlanError(f"{what} must be a JSON object, got {x!r}")
    return x


def _heads(x, what):
    """A head range [h0, h1) as read; checked against the plan's heads once they are known."""
    if x is None:
        return None
    if not (isinstance(x, list) and len(x) == 2 and all(_is_int(v) and v >= 0 for v in x)):
        raise PlanError(f"{what}: heads must be [h0, h1], got {x!r}")
    return tuple(x)


def _range(x, what):
    if not (isinstance(x, list) and len(x) == 3 and all(_is_int(v) and v >= 0 for v in x)):
        raise PlanError(f"{what}: a range must be [doc, start, end], got {x!r}")
    return tuple(x)


class Transfer:
    __slots__ = ("index", "kind", "collective", "tensor", "src", "dst", "ranges", "heads",
                 "issue_at", "arrive_by")

    def __init__(self, index, t, plan, dst=None):
        self.index = index
        self.kind = t.get("kind", "p2p")
        self.collective = t.get("collective")
        self.tensor = t.get("tensor", "kv")
        if self.kind not in ("p2p", "all_gather", "all_to_all", "reduce_scatter"):
            raise PlanError(f"transfer {index}: unknown kind {self.kind!r}")
        if self.tensor not in ("kv", "q", "out"):
            raise PlanError(f"transfer {index}: unknown tensor {self.tensor!r}")
        self.src = _int(t["src"], f"transfer {index}: src")
        self.dst = _int(t["dst"], f"transfer {index}: dst") if dst is None else dst
        if not (0 <= self.src < plan.num_ranks and 0 <= self.dst < plan.num_ranks):
            raise PlanError(f"transfer {index}: rank out of range")
        self.ranges = [_range(r, f"transfer {index}") for r in t["ranges"]]
        self.heads = _heads(t.get("heads"), f"transfer {index}")
        self.issue_at = _int(t["issue_at"], f"transfer {index}: issue_at")
        self.arrive_by = _int(t["arrive_by"], f"transfer {index}: arrive_by")
        # A send issued after it is due (or at a negative step) is never matched in time: the
        # distributed replay deadlocked until the collective timeout (bug hunt).
        if not 0 <= self.issue_at <= self.arrive_by:
            raise PlanError(f"transfer {index}: issued at step {self.issue_at} but due by step "
                            f"{self.arrive_by} (steps are >= 0 and a transfer is due no earlier than it is issued)")

    def call_key(self):
        """Pieces of one collective call share this key (as the simulator groups them)."""
        if self.kind == "p2p" or self.collective is None:
            return None
        return (self.collective, self.kind)


def _receivers(t, index, num_ranks):
    """The ranks transfer `index` reaches: `dst`, then `also_to` (version 2). The executor
    runs each receiver as a transfer of its own, in this order, as the simulator reads it."""
    also = _obj(t, f"transfer {index}").get("also_to", [])
    if not isinstance(also, list) or not all(isinstance(r, int) and not isinstance(r, bool) for r in also):
        raise PlanError(f"transfer {index}: also_to must be a list of ranks, got {also!r}")
    rs = [_int(t["dst"], f"transfer {index}: dst")] + also
    if len(set(rs + [_int(t["src"], f"transfer {index}: src")])) != len(rs) + 1 or not all(0 <= r < num_ranks for r in rs):
        raise PlanError(f"transfer {index}: receivers {rs} repeat a rank, name the source or a rank out of range")
    if also and t.get("tensor", "kv") == "out":
        raise PlanError(f"transfer {index}: an output return has one receiver, not also_to {also!r}")
    return rs


class Plan:
    def __init__(self, obj, origin):
        if not isinstance(obj, dict):
            raise PlanError(f"{origin}: not a JSON object")
        if obj.get("version") not in (1, 2):
            raise PlanError(f"{origin}: plan format version {obj.get('version')!r}, this executor reads versions 1 and 2")
        try:
            self.scheme = obj["scheme"]["name"]
            self.num_ranks = _int(obj["num_ranks"], "num_ranks")
            self.mask = obj["mask"]
            self.q_heads, self.kv_heads = _int(obj["q_heads"], "q_heads"), _int(obj["kv_heads"], "kv_heads")
            self.model = obj.get("model")
            self.hardware = obj.get("hardware")
            docs = [_obj(d, f"document {i}") for i, d in enumerate(obj["documents"])]
            for i, d in enumerate(docs):
                if _int(d["len"], f"document {i}: len") < 1:
                    raise PlanError(f"document {i}: len must be at least 1, got {d['len']}")
            self.extent = [d["len"] + _int(d.get("pad", 0), f"document {i}: pad") for i, d in enumerate(docs)]
            ranks = obj["ranks"]
            if len(ranks) != self.num_ranks:
                raise PlanError(f"{origin}: num_ranks is {self.num_ranks} but {len(ranks)} ranks are listed")
            self.owned = [[_range(r, f"rank {i} owned") for r in rp["owned"]] for i, rp in enumerate(ranks)]
            self.steps = []
            for i, rp in enumerate(ranks):
                steps = []
                for s in rp["steps"]:
                    tasks = []
                    for t in _obj(s, f"rank {i} step")["tasks"]:
                        h = _heads(_obj(t, f"rank {i} task").get("heads"), f"rank {i} task")
                        tasks.append((_range(t["q"], f"rank {i} task"), _range(t["kv"], f"rank {i} task"), h))
                    steps.append(tasks)
                self.steps.append(steps)
            layout = obj.get("input_layout")
            if layout is not None and len(layout) != self.num_ranks:
                raise PlanError(f"{origin}: input_layout has {len(layout)} rank entries, num_ranks is {self.num_ranks}")
            self.initial = ([[_range(r, "input_layout") for r in rs] for rs in layout]
                            if layout is not None else self.owned)
            self.transfers = []
            for i, t in enumerate(obj["transfers"]):
                for dst in _receivers(t, i, self.num_ranks):
                    self.transfers.append(Transfer(len(self.transfers), t, self, dst))
            # What measured.json records so `fcp validate` can tell this batch's plan from
            # another's of the same scheme and step count (src/report/validate.rs,
            # PlanFingerprint: the same four counts).
            self.fingerprint = {"tokens": sum(d["len"] for d in docs), "docs": len(docs),
                                "tasks": sum(len(tasks) for steps in self.steps for tasks in steps),
                                "transfers": len(obj["transfers"])}
        except PlanError as e:
            raise PlanError(str(e) if str(e).startswith(f"{origin}:") else f"{origin}: {e}") from None
        except (KeyError, TypeError, ValueError) as e:
            raise PlanError(f"{origin}: not a valid fcp plan: {type(e).__name__}: {e}") from None
        if self.mask not in ("causal", "full"):
            raise PlanError(f"{origin}: unknown mask {self.mask!r}")
        if self.kv_heads < 1 or self.q_heads < 1 or self.q_heads % self.kv_heads:
            raise PlanError(f"{origin}: q_heads {self.q_heads} is not a positive multiple of kv_heads {self.kv_heads}")
        # Every range and head range the replay will index, checked here (exit 2) rather than
        # met as an IndexError inside a rank (bug hunt: a transfer naming document 7 of 2
        # crashed the distributed replay and passed the single-device one).
        task_ranges = [r for steps in self.steps for tasks in steps for (q, kv, _) in tasks for r in (q, kv)]
        all_ranges = [r for rs in list(self.owned) + list(self.initial) for r in rs]
        all_ranges += task_ranges + [r for t in self.transfers for r in t.ranges]
        for (d, s, e) in all_ranges:
            if d >= len(self.extent) or e > self.extent[d] or s >= e:
                raise PlanError(f"{origin}: range {[d, s, e]} lies outside its document")
        for d, n in enumerate(self.extent):
            if not 0 <= n <= MAX_DOC_LEN:
                raise PlanError(f"{origin}: document {d} has {n} tokens; a plan's documents hold 0 to {MAX_DOC_LEN}")
        # Every token held by exactly one rank, in the layout the replay starts from and in the
        # one it ends with: a document no rank held was never computed, yet its rows were
        # never compared either, and the distributed replay said PASS (bug hunt).
        _check_cover(origin, "owned", self.owned, self.extent)
        if layout is not None:
            _check_cover(origin, "input_layout", self.initial, self.extent)
        heads = [h for steps in self.steps for tasks in steps for (_, _, h) in tasks if h is not None]
        heads += [t.heads for t in self.transfers if t.heads is not None]
        for (h0, h1) in heads:
            if not h0 < h1 <= self.q_heads:
                raise PlanError(f"{origin}: heads {[h0, h1]} are not a range of the plan's {self.q_heads} query heads")
        # A K/V head serves a whole GQA group, so a `kv` transfer moves whole groups; a range
        # inside one moved the whole head here while `fcp verify` and the simulator read a part.
        g = self.q_heads // self.kv_heads
        for t in self.transfers:
            if t.tensor == "kv" and t.heads is not None and (t.heads[0] % g or t.heads[1] % g):
                raise PlanError(f"{origin}: transfer {t.index}: kv heads {list(t.heads)} split a GQA group of {g} query heads; "
                                f"a K/V transfer moves whole K/V heads, so its heads are {[t.heads[0] // g * g, -(-t.heads[1] // g) * g]}")
        self.nsteps = max((len(s) for s in self.steps), default=0)
        # What `fcp verify` refuses and the replay would otherwise run in its own reading
        # (bug hunt): `also_to` in a version-1 plan (a version-1 reader misses those
        # receivers), uneven step counts (a step past the last means different things on
        # different ranks), and one collective id carrying outputs with Q or K/V (the backward
        # pass's calls, named after the id, would merge the two).
        if obj.get("version") == 1 and any(t.get("also_to") for t in obj["transfers"] if isinstance(t, dict)):
            raise PlanError(f"{origin}: also_to needs plan format version 2; this plan says version 1")
        if len({len(s) for s in self.steps}) > 1:
            counts = sorted({len(s) for s in self.steps})
            raise PlanError(f"{origin}: ranks have different numbers of steps ({counts}); every rank has the same")
        ways = {}
        for t in self.transfers:
            if t.collective is not None and t.kind != "p2p":
                ways.setdefault(t.collective, set()).add(t.tensor == "out")
        mixed = sorted(c for c, w in ways.items() if len(w) > 1)
        if mixed:
            raise PlanError(f"{origin}: collective {mixed[0]} carries both `out` pieces and `q`/`kv` pieces; "
                            f"one collective moves one way")
        # Per transfer, whether it forwards received rows: read by the progress check, by
        # `forwarded` (each pass) and by `depths` (each reverse phase), so worked out once.
        self.forwards = forwards(self)
        check_progress(self, origin)

    @staticmethod
    def load(path):
        try:
            with open(path, encoding="utf-8-sig") as f:
                obj = json.load(f)
        except OSError as e:
            raise PlanError(f"{path}: {e.strerror}") from None
        except json.JSONDecodeError as e:
            raise PlanError(f"{path}: not JSON: {e}") from None
        except UnicodeDecodeError as e:
            raise PlanError(f"{path}: not UTF-8 text: {e.reason} at byte {e.start}") from None
        except RecursionError:
            raise PlanError(f"{path}: nested too deeply to be a plan") from None
        return Plan(obj, path)

    @property
    def group(self):
        return self.q_heads // self.kv_heads

    def kv_heads_of(self, heads):
        """K/V heads serving query heads `heads` (GQA groups, rounded out)."""
        if heads is None:
            return (0, self.kv_heads)
        g = self.group
        return (heads[0] // g, -(-heads[1] // g))

    def q_heads_of(self, heads):
        return heads if heads is not None else (0, self.q_heads)

    def total_tokens(self):
        return sum(self.extent)


def rank_docs(plan, rank):
    """The documents `rank` holds rows of at some point: its layouts, its tasks, and the
    transfers it sends or receives (the replay's store covers these and no others)."""
    rs = list(plan.owned[rank]) + list(plan.initial[rank])
    rs += [r for tasks in plan.steps[rank] for (q, kv, _) in tasks for r in (q, kv)]
    rs += [r for t in plan.transfers if rank in (t.src, t.dst) for r in t.ranges]
    return sorted({r[0] for r in rs})


def _overlaps(a, b):
    return a[0] == b[0] and a[1] < b[2] and b[1] < a[2]


def _heads_overlap(a, b):
    return a is None or b is None or (a[0] < b[1] and b[0] < a[1])


def _holds(runs, r):
    """Whether `runs` (sorted (start, end) of one document) cover the range `r`."""
    at = r[1]
    for (s, e) in runs:
        if s > at:
            break
        at = max(at, e)
        if at >= r[2]:
            return True
    return at >= r[2]


def forwards(plan):
    """Per transfer, whether it forwards data its source received rather than held from the
    start (its input layout, else what it owns), as `src/plan/forwarding.rs` decides for the
    simulator and `fcp verify`. An output return never forwards: its sender computed it.
    Before, any overlapping delivery into the source counted, so a rank sending back rows it
    owned and had also been sent waited on a send that waited on it (bug hunt: a plan that
    `fcp verify` and `fcp simulate` accept deadlocked the replay)."""
    held = []
    for ranges in plan.initial:
        by_doc = {}
        for (d, s, e) in ranges:
            by_doc.setdefault(d, []).append((s, e))
        held.append({d: sorted(rs) for d, rs in by_doc.items()})
    return [t.tensor != "out" and not all(_holds(held[t.src].get(r[0], []), r) for r in t.ranges)
            for t in plan.transfers]


def depths(plan, tensors):
    """Forwarding depth of each transfer of `tensors`: 0 when its source had the data without
    a transfer of the same tensor, else 1 + the depth of the transfers that delivered it.
    Reverse passes (dO delivery, gradient returns) run in decreasing depth, so a rank passes
    a gradient back only after everything it forwarded has sent its gradient back to it."""
    ts = [t for t in plan.transfers if t.tensor in tensors]
    fw = plan.forwards
    into = {}
    for t in ts:
        into.setdefault((t.dst, t.tensor), []).append(t)
    memo, visiting = {}, set()

    def depth(t):
        if t.index in memo:
            return memo[t.index]
        if t.index in visiting:
            raise PlanError(f"transfer {t.index}: its data is forwarded in a cycle")
        visiting.add(t.index)
        d = 0
        # Data its source held from the start goes back first: nothing it forwarded feeds it
        # (outputs as `forwarded` reads them).
        for u in (into.get((t.src, t.tensor), []) if fw[t.index] or t.tensor == "out" else []):
            if u.arrive_by <= t.issue_at and _heads_overlap(u.heads, t.heads) and any(
                _overlaps(a, b) for a in u.ranges for b in t.ranges
            ):
                d = max(d, 1 + depth(u))
        visiting.discard(t.index)
        memo[t.index] = d
        return d

    return {t.index: depth(t) for t in ts}


def call_joins(pieces):
    """The step each member joins each collective call at, `{(call key, rank): step}`, from
    `(call key, src, dst, issue step)` per piece (key `None`: not a call): the earliest piece it
    sends or receives, as `fcp verify` and the simulator read it."""
    joins = {}
    for key, src, dst, issue in pieces:
        if key is not None:
            for r in (src, dst):
                joins[(key, r)] = min(joins.get((key, r), issue), issue)
    return joins


def forwarded(plan):
    """Indices of transfers whose source sends data it received (it must wait for that data,
    as the simulator's `forwards` flag says), with the transfers it must wait for: those due
    by the step it is sent at, its `issue_at`, or for a piece of a collective call the step
    its source joins the call (bug hunt: a piece waited for data due after its join, which
    `fcp verify` refuses, and the replay ran the plan)."""
    deps = {}
    fw = plan.forwards
    joins = call_joins((t.call_key(), t.src, t.dst, t.issue_at) for t in plan.transfers)
    for t in plan.transfers:
        # Outputs: a rank merges what it was sent before passing its rows on.
        if t.tensor != "out" and not fw[t.index]:
            continue
        key = t.call_key()
        at = t.issue_at if key is None else joins[(key, t.src)]
        need = [
            u.index
            for u in plan.transfers
            if u.dst == t.src and u.tensor == t.tensor and u.arrive_by <= at
            and _heads_overlap(u.heads, t.heads)
            and any(_overlaps(a, b) for a in u.ranges for b in t.ranges)
        ]
        if need:
            deps[t.index] = need
    return deps


def check_progress(plan, origin):
    """Refuse a plan that cannot run to its end, as `fcp verify` does (invariant 12,
    `src/plan/verify/progress.rs`): run it in logical time, where a rank gets past a step once
    every input of that step can have been sent. A message leaves when its sender reaches its
    issue step, or, forwarding received rows, once the sender can start that step; a collective
    call runs once every member has joined it, at the earliest step of a piece it sends or
    receives. Before, such a plan stalled every rank until the gloo timeout (bug hunt)."""
    n = plan.num_ranks
    steps = [len(s) for s in plan.steps]
    fw = plan.forwards
    needs = [dict() for _ in range(n)]  # rank -> {step: [("rank", src, past) | ("call", c)]}

    def need(r, s, what):
        # Past the last step, the end waits (index steps[r]): the replay waits for every
        # message before it ends, and forwards issued there leave once all are in.
        needs[r].setdefault(min(s, steps[r]), []).append(what)

    calls = {}  # (collective, kind) -> {rank: [join step, earliest step waiting on it]}
    for t in plan.transfers:
        need_by = None if t.tensor == "out" else t.arrive_by
        key = t.call_key()
        if key is None:
            last = steps[t.src]
            issue = min(t.issue_at, last)
            past = issue + 1 if fw[t.index] else issue
            if need_by is not None:
                need(t.dst, need_by, ("rank", t.src, past))
            continue
        call = calls.setdefault(key, {})
        for r, waits in ((t.src, None), (t.dst, need_by)):
            m = call.setdefault(r, [None, None])
            m[0] = t.issue_at if m[0] is None else min(m[0], t.issue_at)
            if waits is not None:
                m[1] = waits if m[1] is None else min(m[1], waits)
    members, names = [], []
    for c, (key, call) in enumerate(sorted(calls.items(), key=lambda kv: (kv[0][0], kv[0][1]))):
        for r, (_, w) in call.items():
            if w is not None:
                need(r, w, ("call", c))
        members.append([(r, min(j, steps[r])) for r, (j, _) in sorted(call.items())])
        names.append(key[0])
    waiters = [set() for _ in range(n)]
    call_waiters = [set() for _ in members]
    for r in range(n):
        for lst in needs[r].values():
            for x in lst:
                (waiters[x[1]] if x[0] == "rank" else call_waiters[x[1]]).add(r)
    joins = [[] for _ in range(n)]
    missing = [len(m) for m in members]
    for c, m in enumerate(members):
        for r, j in m:
            joins[r].append((c, j))
    past = [0] * n
    ran = [False] * len(members)
    queue, queued = list(range(n)), [True] * n

    def wake(rs):
        for w in rs:
            if not queued[w]:
                queued[w] = True
                queue.append(w)

    def joined(r, at):
        for c, j in joins[r]:
            if j == at:
                missing[c] -= 1
                if missing[c] == 0:
                    ran[c] = True
                    wake(call_waiters[c])

    def met(x):
        return past[x[1]] >= x[2] if x[0] == "rank" else ran[x[1]]

    for r in range(n):
        joined(r, 0)
    while queue:
        r = queue.pop()
        queued[r] = False
        before = past[r]
        while past[r] <= steps[r] and all(met(x) for x in needs[r].get(past[r], [])):
            past[r] += 1
            joined(r, past[r])
        if past[r] > before:
            wake(waiters[r])
    for r in range(n):
        if past[r] <= steps[r]:
            s = past[r]
            x = next((x for x in needs[r].get(s, []) if not met(x)), None)
            if x is None:
                why = ""
            elif x[0] == "rank":
                at = f"its step {past[x[1]]}" if past[x[1]] < steps[x[1]] else "its end"
                why = f": it waits for a transfer from rank {x[1]}, which never gets past {at}"
            else:
                late = [f"rank {m} (joins at step {j})" for m, j in members[x[1]] if past[m] < j][:4]
                why = f": it waits for collective {names[x[1]]} to run, which waits for {', '.join(late)}"
            stuck = f"never starts step {s}" if s < steps[r] else "never gets past its end"
            raise PlanError(f"{origin}: the plan cannot run to its end: rank {r} {stuck}{why} "
                            f"(`fcp verify` reports it as Deadlock)")
