//! Where a rank's waiting goes. A rank waits (its compute stream has work left, or its own
//! messages are not done) either while some message of its own is moving, so a link sets the
//! pace (exposed communication proper), or while nothing of its own is in flight: the data it
//! needs has not been sent yet because the peer that sends it is still computing. The second
//! kind is imbalance seen from the waiting rank. FCP's light ranks, for instance, wait at the
//! end of the backward pass for the dK/dV that busier ranks return only when their last step
//! is done; counting that as communication pointed users at links when the cure was balance.

use super::engine::RankTimeline;

/// Time intervals `[start, end)` in nanoseconds.
pub type Spans = Vec<(u64, u64)>;

/// The union of intervals `[a, b)`, sorted, with empty ones dropped.
pub fn union(mut v: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    v.retain(|s| s.1 > s.0);
    v.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::new();
    for (a, b) in v {
        match out.last_mut() {
            Some(last) if a <= last.1 => last.1 = last.1.max(b),
            _ => out.push((a, b)),
        }
    }
    out
}

/// The gaps of `busy` (sorted, disjoint) inside `[0, end)`.
pub fn gaps(busy: &[(u64, u64)], end: u64) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let mut t = 0;
    for &(a, b) in busy {
        if a.min(end) > t {
            out.push((t, a.min(end)));
        }
        t = t.max(b);
    }
    if end > t {
        out.push((t, end));
    }
    out
}

/// Total length of intervals.
pub fn total(v: &[(u64, u64)]) -> u64 {
    v.iter().map(|&(a, b)| b - a).sum()
}

/// A rank's waits, as `(in_flight, on_peers)`: the gaps before and between its steps and the
/// tail from its last step to `finish`, cut where at least one of its messages or collectives
/// is in flight (the first list) and where none is (the second). Together they are the
/// engine's `exposed_ns`.
pub fn split_waits(tl: &RankTimeline, finish: u64) -> (Spans, Spans) {
    let moving = union(tl.send.iter().chain(&tl.recv).copied().collect());
    // The stream is busy with token-linear work too (whole-layer runs).
    let busy: Vec<(u64, u64)> = tl.compute.iter().chain(&tl.linear).copied().collect();
    split(&busy, &moving, finish)
}

/// [`split_waits`] given the rank's steps and the union of its messages' spans (`moving`,
/// sorted and disjoint), which the engine has at hand already.
pub fn split(steps: &[(u64, u64)], moving: &[(u64, u64)], finish: u64) -> (Spans, Spans) {
    let compute = union(steps.to_vec());
    let compute_end = compute.last().map_or(0, |s| s.1);
    let mut waits = gaps(&compute, compute_end);
    if finish > compute_end {
        waits.push((compute_end, finish));
    }
    let (mut in_flight, mut on_peers) = (Vec::new(), Vec::new());
    let mut j = 0;
    for (a, b) in waits {
        let mut t = a;
        while j < moving.len() && moving[j].1 <= t {
            j += 1;
        }
        let mut k = j;
        while t < b {
            match moving.get(k) {
                Some(&(s, e)) if s < b => {
                    if s > t {
                        on_peers.push((t, s));
                    }
                    let stop = e.min(b);
                    if stop > t.max(s) {
                        in_flight.push((t.max(s), stop));
                    }
                    t = t.max(stop);
                    k += 1;
                }
                _ => {
                    on_peers.push((t, b));
                    t = b;
                }
            }
        }
    }
    (in_flight, on_peers)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn timeline(compute: &[(u64, u64)], send: &[(u64, u64)], recv: &[(u64, u64)]) -> RankTimeline {
        RankTimeline {
            compute: compute.to_vec(),
            send: send.to_vec(),
            recv: recv.to_vec(),
            linear: Vec::new(),
        }
    }

    #[test]
    fn unions_and_gaps() {
        assert_eq!(union(vec![(5, 7), (0, 2), (1, 3)]), vec![(0, 3), (5, 7)]);
        assert_eq!(gaps(&[(1, 3), (5, 7)], 9), vec![(0, 1), (3, 5), (7, 9)]);
    }

    #[test]
    fn a_wait_with_nothing_in_flight_is_on_a_peer() {
        // Waits: [0,2) before the first step, [5,7) between steps, [9,15) after the last.
        // Messages move over [1,3) and [12,20).
        let tl = timeline(&[(2, 5), (7, 9)], &[(1, 3)], &[(12, 20)]);
        let (flight, peers) = split_waits(&tl, 15);
        assert_eq!(flight, vec![(1, 2), (12, 15)]);
        assert_eq!(peers, vec![(0, 1), (5, 7), (9, 12)]);
    }

    proptest! {
        /// The two lists tile the waits exactly: disjoint, inside them, with the in-flight one
        /// covered by messages and the other one touching none (checked tick by tick).
        #[test]
        fn waits_split_into_in_flight_and_on_peers(
            steps in prop::collection::vec((0u64..30, 0u64..6), 0..6),
            msgs in prop::collection::vec((0u64..40, 0u64..10), 0..6),
            tail in 0u64..10,
        ) {
            let compute: Vec<(u64, u64)> = steps.iter().map(|&(a, d)| (a, a + d)).collect();
            let send: Vec<(u64, u64)> = msgs.iter().map(|&(a, d)| (a, a + d)).collect();
            let tl = timeline(&compute, &send, &[]);
            let c = union(compute.clone());
            let end = c.last().map_or(0, |s| s.1);
            let finish = end + tail;
            let (flight, peers) = split_waits(&tl, finish);
            let inside = |v: &[(u64, u64)], t: u64| v.iter().any(|&(a, b)| a <= t && t < b);
            for t in 0..finish {
                let waiting = !inside(&c, t);
                let moving = inside(&send, t);
                prop_assert_eq!(inside(&flight, t), waiting && moving, "t={}", t);
                prop_assert_eq!(inside(&peers, t), waiting && !moving, "t={}", t);
            }
            prop_assert_eq!(total(&flight) + total(&peers), total(&gaps(&c, end)) + tail);
        }
    }
}
