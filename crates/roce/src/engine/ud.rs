//! The UD engine: SEND/SEND_WITH_IMM datagrams of at most one MTU, Q_Key checks, and the GRH
//! written at the start of every receive buffer.

pub use super::grh::GRH_LEN;

use super::config::{pkey_matches, UdConfig, MAX_MTU, MIN_MTU};
use super::local::{capacity, resolve, scatter, Payload};
use super::psn::Psn;
use super::stats::UdStats;
use super::{grh, imm_from_wire, imm_to_wire, well_formed};
use softrdma_verbs::qp::SendWqe;
use softrdma_verbs::qp_host::QpOutputs;
use softrdma_verbs::wr::wc_flags;
use softrdma_verbs::QpHost;
use softrdma_verbs::{QpState, SendFlags, WcOpcode, WcStatus, WorkCompletion, WrOpcode};
use softrdma_wire::roce::{push_pad, Bth, Deth, RoceHeaders, RoceOpcode, RocePacket, ICRC_LEN, QPN_MASK};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;

/// The destination QP number of multicast packets.
const MULTICAST_QPN: u32 = QPN_MASK;
/// A WR Q_Key with this bit set means "use the QP's own Q_Key".
const QKEY_USE_OWN: u32 = 0x8000_0000;

/// Where a received datagram came from (from its IP/UDP headers), for the GRH.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdSource {
    /// Sender's IP address.
    pub src_ip: IpAddr,
    /// The address it was sent to (ours, or a multicast group).
    pub dst_ip: IpAddr,
    /// TTL / hop limit it arrived with.
    pub hop_limit: u8,
    /// TOS / traffic class it arrived with.
    pub traffic_class: u8,
}

/// Where to send a datagram `poll_transmit` produced (from the WR's address handle).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdTransmit {
    /// Destination GID (the destination IP as a GID).
    pub dgid: [u8; 16],
    /// Source GID index (the source IP).
    pub sgid_index: u8,
    /// Traffic class for the IP header.
    pub traffic_class: u8,
    /// Hop limit / TTL for the IP header.
    pub hop_limit: u8,
}

/// The transport engine of one UD QP.
#[derive(Debug)]
pub struct UdEngine {
    qp: Arc<dyn QpHost>,
    cfg: UdConfig,
    psn: Psn,
    stats: UdStats,
    flushed: bool,
    reset: bool,
    /// Completions, flushes and async events for the driver ([`UdEngine::take_outputs`]).
    out: QpOutputs,
}

impl UdEngine {
    /// An engine for the UD QP `qp`.
    pub fn new(qp: Arc<dyn QpHost>, mut cfg: UdConfig) -> UdEngine {
        cfg.mtu = cfg.mtu.clamp(MIN_MTU, MAX_MTU);
        cfg.local_qpn &= QPN_MASK;
        UdEngine {
            qp,
            cfg,
            psn: Psn::new(0),
            stats: UdStats::default(),
            flushed: false,
            reset: false,
            out: QpOutputs::default(),
        }
    }

    /// What the engine reported since the last call, oldest first (see
    /// `RcEngine::take_outputs`).
    pub fn take_outputs(&mut self) -> QpOutputs {
        self.out.take()
    }

    /// Whether [`UdEngine::take_outputs`] has anything.
    pub fn has_outputs(&self) -> bool {
        !self.out.is_empty()
    }

    /// The QP this engine serves.
    pub fn qp(&self) -> &Arc<dyn QpHost> {
        &self.qp
    }

    /// Delivers one datagram (ICRC already checked) into the next receive WR, behind a GRH
    /// built from `src`. Wrong Q_Key, no receive WR, or anything malformed: dropped, counted.
    pub fn handle_packet(&mut self, _now: Instant, pkt: &RocePacket<'_>, src: &UdSource) {
        if self.stopped() {
            return;
        }
        self.stats.rx_packets += 1;
        let h = &pkt.headers;
        let bth = &h.bth;
        let addressed = bth.dest_qp == self.cfg.local_qpn || bth.dest_qp == MULTICAST_QPN;
        let receiving = matches!(
            self.qp.state(),
            QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
        );
        let ok = bth.opcode.is_ud()
            && addressed
            && receiving
            && pkey_matches(bth.pkey, self.cfg.pkey)
            && well_formed(pkt)
            && pkt.payload.len() <= self.cfg.mtu;
        let Some(deth) = h.deth.filter(|_| ok) else {
            self.stats.rx_dropped_invalid += 1;
            return;
        };
        if deth.qkey != self.cfg.qkey {
            self.stats.rx_dropped_qkey += 1;
            return;
        }
        let Some(recv) = self.qp.take_recv() else {
            self.stats.rx_dropped_no_recv += 1;
            return;
        };
        let qpn = self.qp.qpn();
        let pieces = match resolve(&recv.sg_list, &*self.qp, true) {
            Ok(p) => p,
            Err(e) => {
                tracing::debug!(qpn, wr_id = recv.wr_id, error = %e, "UD receive WR with a bad buffer");
                let wc = WorkCompletion::new(recv.wr_id, WcStatus::LocProtErr, WcOpcode::Recv, qpn);
                self.out.recv_done(wc);
                self.fail();
                return;
            }
        };
        let total = GRH_LEN + pkt.payload.len();
        if total as u64 > capacity(&pieces) {
            self.stats.rx_length_errors += 1;
            let mut wc = WorkCompletion::new(recv.wr_id, WcStatus::LocLenErr, WcOpcode::Recv, qpn);
            wc.byte_len = total as u32;
            self.out.recv_done(wc);
            return;
        }
        let udp_payload = h.header_len() + pkt.payload.len() + usize::from(bth.pad_count) + ICRC_LEN;
        let placed = scatter(&pieces, 0, &grh::build(src, udp_payload)) && scatter(&pieces, GRH_LEN, pkt.payload);
        let status = if placed {
            WcStatus::Success
        } else {
            WcStatus::LocProtErr
        };
        let mut wc = WorkCompletion::new(recv.wr_id, status, WcOpcode::Recv, qpn);
        if placed {
            self.stats.rx_delivered += 1;
            wc.byte_len = total as u32;
            wc.wc_flags = wc_flags::GRH;
            wc.src_qp = deth.src_qp;
            wc.sl = grh::l3_type(src);
            wc.solicited = bth.solicited;
            if let Some(imm) = h.imm {
                wc.wc_flags |= wc_flags::WITH_IMM;
                wc.imm_data = imm_from_wire(imm);
            }
        }
        self.out.recv_done(wc);
        if !placed {
            self.fail();
        }
    }

    /// Clears `out` and writes the next datagram (BTH through pad, no ICRC); returns where it
    /// goes. The send WR completes at once (UD is unreliable). None: nothing to send.
    pub fn poll_transmit(&mut self, _now: Instant, out: &mut Vec<u8>) -> Option<UdTransmit> {
        out.clear();
        if self.stopped() || self.qp.state() != QpState::Rts {
            return None;
        }
        let wqe = self.qp.pop_send_if(&mut |_| true)?;
        let qpn = self.qp.qpn();
        let op = wqe.wr.opcode.map_or(WcOpcode::Send, WrOpcode::wc_opcode);
        match self.build(&wqe, out) {
            Ok(dest) => {
                self.stats.tx_packets += 1;
                let mut wc = WorkCompletion::new(wqe.wr.wr_id, WcStatus::Success, op, qpn);
                wc.byte_len = wqe.wr.total_len() as u32;
                self.out.send_done(wc, wqe.signaled);
                Some(dest)
            }
            Err((status, why)) => {
                out.clear();
                self.stats.tx_errors += 1;
                tracing::debug!(qpn, wr_id = wqe.wr.wr_id, %why, "UD send WR failed");
                self.out
                    .send_done(WorkCompletion::new(wqe.wr.wr_id, status, op, qpn), true);
                // IBTA: a send completing in error moves the QP to ERR.
                self.fail();
                None
            }
        }
    }

    fn build(&mut self, wqe: &SendWqe, out: &mut Vec<u8>) -> Result<UdTransmit, (WcStatus, String)> {
        let wr = &wqe.wr;
        let (opcode, imm) = match wr.opcode {
            Some(WrOpcode::Send) => (RoceOpcode::UdSendOnly, None),
            Some(WrOpcode::SendWithImm) => (RoceOpcode::UdSendOnlyImm, Some(imm_to_wire(wr.imm_data))),
            other => return Err((WcStatus::LocQpOpErr, format!("opcode {other:?} on a UD QP"))),
        };
        let Some(ud) = wr.ud else {
            return Err((WcStatus::LocQpOpErr, "no address handle".into()));
        };
        let len = wr.total_len();
        if len > self.cfg.mtu as u64 {
            return Err((
                WcStatus::LocLenErr,
                format!("{len} bytes exceed the {}-byte MTU", self.cfg.mtu),
            ));
        }
        let payload = match &wqe.inline {
            Some(data) => Payload::Inline(data.clone()),
            None => match resolve(&wr.sg_list, &*self.qp, false) {
                Ok(p) => Payload::Pieces(p),
                Err(e) => return Err((WcStatus::LocProtErr, format!("SGE {e}"))),
            },
        };
        let mut bth = Bth::new(opcode, ud.remote_qpn, self.psn.get());
        bth.pkey = self.cfg.pkey;
        bth.solicited = wr.flags.contains(SendFlags::SOLICITED);
        let mut h = RoceHeaders::new(bth);
        let qkey = if ud.remote_qkey & QKEY_USE_OWN != 0 {
            self.cfg.qkey
        } else {
            ud.remote_qkey
        };
        h.deth = Some(Deth {
            qkey,
            src_qp: self.cfg.local_qpn,
        });
        h.imm = imm;
        // The payload goes from the source buffers straight behind the headers.
        let start = out.len();
        h.emit_headers(len as usize, out);
        if !payload.gather(0, len as usize, out) {
            out.truncate(start);
            return Err((WcStatus::LocProtErr, "source buffer not readable".into()));
        }
        push_pad(out, len as usize);
        self.psn = self.psn.add(1);
        Ok(UdTransmit {
            dgid: ud.ah.dgid,
            sgid_index: ud.ah.sgid_index,
            traffic_class: ud.ah.traffic_class,
            hop_limit: ud.ah.hop_limit,
        })
    }

    /// Call after the application changed the QP: ERR flushes the queues, RESET stops.
    pub fn sync_state(&mut self, _now: Instant) {
        let _ = self.stopped();
    }

    /// True once the QP is in ERR and flushed (or was reset): the driver may drop the engine.
    pub fn is_closed(&self) -> bool {
        self.reset || self.flushed
    }

    /// Counters.
    pub fn stats(&self) -> UdStats {
        self.stats
    }

    fn stopped(&mut self) -> bool {
        if self.reset {
            return true;
        }
        match self.qp.state() {
            QpState::Err => {
                self.fail();
                true
            }
            QpState::Reset => {
                self.reset = true;
                true
            }
            _ => self.flushed,
        }
    }

    fn fail(&mut self) {
        if !self.flushed && self.qp.state() != QpState::Err {
            // An error completion moved the QP to ERR (not the application's modify).
            self.out.fatal();
        }
        let (sends, recvs) = self.qp.enter_error();
        self.out.flush(sends, recvs);
        self.flushed = true;
    }
}
