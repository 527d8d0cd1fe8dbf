//! Liveness of the peer while this QP has nothing outstanding.
//!
//! A requester with work in flight notices a dead peer by its ACK timeout. A QP with only
//! receives posted would never notice: on a real fabric the dead process's kernel sends the
//! DREQ, but a killed softrdma process cannot. So an idle RTS QP that heard nothing from its
//! peer for `interval` sends a probe, like a TCP keepalive: a duplicate of the last
//! acknowledged request (RDMA WRITE Only, zero length, PSN = oldest unacknowledged − 1, AckReq).
//! Every IBTA responder answers a duplicate SEND/WRITE with an ACK and executes nothing
//! (C9-105); no PSN is used, no receive WR is consumed, no access right is needed. Unanswered
//! probes are resent `retry_cnt` times, then the QP fails with
//! [`RcError::PeerUnresponsive`](super::RcError::PeerUnresponsive). A resend waits the ACK
//! timeout, but never less than half the interval: an idle QP on a real fabric never fails,
//! so a live peer that stops for a few seconds (a descheduled VM, a loaded emulator: Linux rxe
//! in a TCG guest did) must not be taken for dead just because the application chose a short
//! ACK timeout. With the defaults a dead peer is found after about 10 s of silence (2 s, then
//! 8 × 1 s with ACK timeout 14, or 8 × 1.07 s with rdma_cm's 18).
//!
//! Any valid packet from the peer counts as an answer. A peer alive but unable to answer for
//! that long (stopped in a debugger) looks dead too, as it does to a requester with work in
//! flight.

use super::error::RcError;
use super::psn::Psn;
use softrdma_wire::roce::{Bth, Reth, RoceHeaders, RoceOpcode};
use std::time::{Duration, Instant};

/// Default idle time before the first probe.
pub const DEFAULT_KEEPALIVE: Duration = Duration::from_secs(2);

/// Probes in flight.
#[derive(Debug, Clone, Copy)]
struct Probing {
    /// When the last probe went out.
    sent_at: Instant,
    /// Probes still allowed after this one.
    left: u8,
    /// Probes sent so far.
    sent: u8,
}

/// The keepalive state of one RC QP.
#[derive(Debug, Clone, Default)]
pub(crate) struct Keepalive {
    /// Idle time before probing (`None`: off).
    interval: Option<Duration>,
    /// When the peer was last heard from (or the QP reached RTS).
    last_heard: Option<Instant>,
    probing: Option<Probing>,
    /// A probe is waiting for `poll_transmit`.
    pending: bool,
}

impl Keepalive {
    /// Keepalive with `interval` (`None`: never probe).
    pub(crate) fn new(interval: Option<Duration>) -> Keepalive {
        Keepalive {
            interval,
            ..Keepalive::default()
        }
    }

    /// The QP can send (RTS): silence counts from `now` unless the peer was heard already.
    pub(crate) fn start(&mut self, now: Instant) {
        self.last_heard.get_or_insert(now);
    }

    /// A valid packet came from the peer.
    pub(crate) fn heard(&mut self, now: Instant) {
        self.last_heard = Some(now);
        self.probing = None;
        self.pending = false;
    }

    /// The requester has work in flight: its ACK timer watches the peer instead.
    pub(crate) fn busy(&mut self) {
        self.probing = None;
        self.pending = false;
    }

    /// When an idle QP sends its first probe (None: off, not started, or probing already).
    /// `ack_timeout` `None` (IB timeout 0, "wait forever") turns probing off as well.
    pub(crate) fn due(&self, ack_timeout: Option<Duration>) -> Option<Instant> {
        ack_timeout?;
        if self.probing.is_some() {
            return None;
        }
        self.last_heard?.checked_add(self.interval?)
    }

    /// When an unanswered probe is resent (or the peer declared lost).
    pub(crate) fn retry_deadline(&self, ack_timeout: Option<Duration>) -> Option<Instant> {
        self.probing?.sent_at.checked_add(self.resend_after(ack_timeout)?)
    }

    /// How long an unanswered probe waits: the ACK timeout, at least half the interval.
    fn resend_after(&self, ack_timeout: Option<Duration>) -> Option<Duration> {
        Some(ack_timeout?.max(self.interval? / 2))
    }

    /// Timer expiry on an idle QP: the first probe, a resend, or the verdict once `retries`
    /// resends went unanswered.
    pub(crate) fn on_timeout(
        &mut self,
        now: Instant,
        ack_timeout: Option<Duration>,
        retries: u8,
    ) -> Result<(), RcError> {
        if let Some(mut p) = self.probing {
            if self.retry_deadline(ack_timeout).is_none_or(|d| now < d) {
                return Ok(());
            }
            if p.left == 0 {
                self.probing = None;
                let silent = now.saturating_duration_since(self.last_heard.unwrap_or(now));
                return Err(RcError::PeerUnresponsive { probes: p.sent, silent });
            }
            p.left -= 1;
            p.sent = p.sent.saturating_add(1);
            p.sent_at = now;
            self.probing = Some(p);
            self.pending = true;
        } else if self.due(ack_timeout).is_some_and(|d| now >= d) {
            self.probing = Some(Probing {
                sent_at: now,
                left: retries,
                sent: 1,
            });
            self.pending = true;
        }
        Ok(())
    }

    /// Writes the pending probe (if any) into `out`: a duplicate zero-length RDMA WRITE Only
    /// at `una − 1` to `dest_qpn`.
    pub(crate) fn poll_transmit(&mut self, una: Psn, dest_qpn: u32, pkey: u16, out: &mut Vec<u8>) -> bool {
        if !std::mem::take(&mut self.pending) {
            return false;
        }
        let mut bth = Bth::new(RoceOpcode::RcWriteOnly, dest_qpn, una.sub(1).get());
        bth.pkey = pkey;
        bth.ack_req = true;
        let mut h = RoceHeaders::new(bth);
        h.reth = Some(Reth {
            va: 0,
            rkey: 0,
            dma_len: 0,
        });
        out.clear();
        h.emit(&[], out);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use softrdma_wire::roce::RocePacket;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn probes_after_interval_then_gives_up() {
        let t0 = Instant::now();
        let ack = Some(10 * MS);
        let mut k = Keepalive::new(Some(100 * MS));
        assert_eq!(k.due(ack), None, "not started");
        k.start(t0);
        assert_eq!(k.due(ack), Some(t0 + 100 * MS));
        assert_eq!(k.due(None), None, "IB timeout 0 waits forever: no probing");
        k.on_timeout(t0 + 99 * MS, ack, 2).unwrap();
        let mut out = Vec::new();
        assert!(!k.poll_transmit(Psn::new(5), 7, 0xffff, &mut out));
        let mut now = t0 + 100 * MS;
        for n in 0..3 {
            k.on_timeout(now, ack, 2).unwrap();
            assert!(k.poll_transmit(Psn::new(5), 7, 0xffff, &mut out), "probe {n}");
            let p = RocePacket::parse(&out).unwrap();
            assert_eq!(p.opcode(), RoceOpcode::RcWriteOnly);
            assert_eq!((p.headers.bth.psn, p.headers.bth.dest_qp), (4, 7));
            assert!(p.headers.bth.ack_req && p.payload.is_empty());
            assert_eq!(p.headers.reth.map(|r| r.dma_len), Some(0));
            assert_eq!(k.due(ack), None);
            // ACK timeout 10 ms, but a resend waits at least half the interval.
            assert_eq!(k.retry_deadline(ack), Some(now + 50 * MS));
            assert_eq!(k.retry_deadline(Some(80 * MS)), Some(now + 80 * MS));
            k.on_timeout(now + 49 * MS, ack, 2).unwrap();
            assert!(!k.poll_transmit(Psn::new(5), 7, 0xffff, &mut out));
            now += 50 * MS;
        }
        let err = k.on_timeout(now, ack, 2).unwrap_err();
        assert_eq!(
            err,
            RcError::PeerUnresponsive {
                probes: 3,
                silent: 250 * MS
            }
        );
    }

    #[test]
    fn an_answer_or_work_in_flight_ends_probing() {
        let t0 = Instant::now();
        let ack = Some(10 * MS);
        let mut k = Keepalive::new(Some(100 * MS));
        k.start(t0);
        k.start(t0 + 50 * MS);
        assert_eq!(k.due(ack), Some(t0 + 100 * MS), "start keeps the first instant");
        k.on_timeout(t0 + 100 * MS, ack, 0).unwrap();
        k.heard(t0 + 105 * MS);
        assert_eq!(k.retry_deadline(ack), None);
        assert_eq!(k.due(ack), Some(t0 + 205 * MS));
        let mut out = Vec::new();
        assert!(
            !k.poll_transmit(Psn::new(0), 7, 0xffff, &mut out),
            "answered before it went out"
        );
        k.on_timeout(t0 + 205 * MS, ack, 0).unwrap();
        k.busy();
        assert!(!k.poll_transmit(Psn::new(0), 7, 0xffff, &mut out));
        assert_eq!(k.due(ack), Some(t0 + 205 * MS), "idle again: due at once");
        assert_eq!(Keepalive::new(None).due(ack), None);
    }
}
