//! UDP segmentation offload for same-host soft-RoCE: send side (GSO) and receive side (GRO).
//!
//! A multi-packet RDMA WRITE or SEND is a run of datagrams of one size (the path MTU plus
//! headers) to one destination. Sent one by one, each datagram crosses the whole UDP/IP stack
//! twice (a sender's and a receiver's skb); measured on `lo`, 4 KiB datagrams top out near a
//! quarter of what TCP moves. With `UDP_SEGMENT` (GSO) the run goes as one send: the kernel
//! cuts it into datagrams of the given size (only the last may be shorter). A receiving socket
//! with `UDP_GRO` gets such a run from `lo` in one read, with its segment size in a control
//! message, and splits it itself ([`segments`]).
//!
//! The IPv4 Identification is covered by the ICRC. An unconnected socket with
//! `IP_PMTUDISC_DO` sends ID 0 (see `net`); the kernel's segmentation then numbers the
//! segments 0, 1, 2, ... (`inet_gso_segment`), so packet `k` of a run carries its ICRC for
//! ID `k`. IPv6 has no such field. A receiver does not need to know: softrdma solves the ID
//! from the ICRC (`check_icrc_any_id`), and Linux rxe sees the real header.
//!
//! Only runs to a loopback address use GSO: `lo` always segments in software and checksums
//! nothing, while another interface might lack the offloads UDP_SEGMENT needs (the send fails
//! with EIO) or segment elsewhere. `SOFTRDMA_ROCE_GSO=0` turns both sides off.

/// Most segments one `UDP_SEGMENT` send may carry (`UDP_MAX_SEGMENTS` of Linux 4.18–6.1).
pub const MAX_SEGMENTS: usize = 64;
/// Most UDP payload bytes in one send (an IPv4 packet of 65,535 bytes).
pub const MAX_PAYLOAD: usize = 65_507;

/// `UDP_SEGMENT` (linux/udp.h): the send side's segment size, as a socket option or `cmsg`.
pub const UDP_SEGMENT: libc::c_int = 103;
/// `UDP_GRO` (linux/udp.h): a socket option, and the receive `cmsg` with the segment size.
pub const UDP_GRO: libc::c_int = 104;

/// Whether same-host GSO/GRO is on (`SOFTRDMA_ROCE_GSO`, default on).
pub fn wanted() -> bool {
    !softrdma_verbs::settings::ROCE_GSO.is("0")
}

/// Cuts a batch of `n` datagrams (datagram `i` is `len_of(i)` bytes long) into runs that may
/// each go as one send: `(first, count)` in order, covering every datagram once. A run of
/// more than one datagram has `eligible` members only, with `same(first, j)` for each, all
/// as long as the first except the last (which may be shorter), at most [`MAX_SEGMENTS`] and
/// [`MAX_PAYLOAD`] bytes.
pub fn plan_runs(
    n: usize,
    len_of: impl Fn(usize) -> usize,
    eligible: impl Fn(usize) -> bool,
    same: impl Fn(usize, usize) -> bool,
    runs: &mut Vec<(usize, usize)>,
) {
    runs.clear();
    let mut i = 0;
    while i < n {
        let size = len_of(i);
        let mut count = 1;
        let mut total = size;
        if eligible(i) && size > 0 {
            while i + count < n {
                let j = i + count;
                let len = len_of(j);
                let prev_full = len_of(j - 1) == size;
                if !prev_full
                    || len > size
                    || len == 0
                    || count >= MAX_SEGMENTS
                    || total + len > MAX_PAYLOAD
                    || !eligible(j)
                    || !same(i, j)
                {
                    break;
                }
                count += 1;
                total += len;
            }
        }
        runs.push((i, count));
        i += count;
    }
}

/// The datagrams of one received buffer: cut at `segment` bytes when the kernel coalesced a
/// run (`UDP_GRO`), else the buffer itself.
pub fn segments(buf: &[u8], segment: Option<usize>) -> impl Iterator<Item = &[u8]> {
    let size = segment.filter(|&s| s > 0).unwrap_or(buf.len().max(1));
    buf.chunks(size)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(
        lens: &[usize],
        eligible: impl Fn(usize) -> bool,
        same: impl Fn(usize, usize) -> bool,
    ) -> Vec<(usize, usize)> {
        let mut runs = Vec::new();
        plan_runs(lens.len(), |i| lens[i], eligible, same, &mut runs);
        runs
    }

    #[test]
    fn equal_datagrams_form_one_run_ending_with_a_shorter_one() {
        // WRITE FIRST (with RETH), middles, LAST; then a second message's two packets.
        let lens = [4140, 4112, 4112, 4112, 700, 4112, 20];
        // A shorter datagram ends a run: the FIRST takes one middle along.
        assert_eq!(plan(&lens, |_| true, |_, _| true), vec![(0, 2), (2, 3), (5, 2)]);
        let same = [4112; 5];
        assert_eq!(plan(&same, |_| true, |_, _| true), vec![(0, 5)]);
    }

    #[test]
    fn runs_respect_destination_eligibility_and_limits() {
        let lens = [1000; 10];
        // A destination change after the third.
        assert_eq!(plan(&lens, |_| true, |a, b| (a < 3) == (b < 3)), vec![(0, 3), (3, 7)]);
        // An ineligible one in the middle goes alone.
        assert_eq!(plan(&lens, |i| i != 4, |_, _| true), vec![(0, 4), (4, 1), (5, 5)]);
        // At most MAX_PAYLOAD bytes: 15 of 4136 fit, 16 do not.
        let big = [4136; 40];
        let runs = plan(&big, |_| true, |_, _| true);
        assert_eq!(runs, vec![(0, 15), (15, 15), (30, 10)]);
        // At most MAX_SEGMENTS datagrams.
        let small = [100; 130];
        let runs = plan(&small, |_| true, |_, _| true);
        assert_eq!(runs, vec![(0, 64), (64, 64), (128, 2)]);
        assert!(plan(&[], |_| true, |_, _| true).is_empty());
    }

    #[test]
    fn received_runs_split_at_the_segment_size() {
        let buf: Vec<u8> = (0..10).collect();
        let got: Vec<&[u8]> = segments(&buf, Some(4)).collect();
        assert_eq!(got, vec![&buf[0..4], &buf[4..8], &buf[8..10]]);
        assert_eq!(segments(&buf, None).count(), 1);
        assert_eq!(segments(&buf, Some(0)).count(), 1);
        assert_eq!(segments(&[], None).count(), 0);
    }
}
