//! The soft-iWARP protocol engine for one connected QP, sans-I/O.
//!
//! Bytes from the TCP stream go in ([`Engine::rx_scatter`] + [`Engine::rx_received`]: the
//! receive buffer, and a large WRITE, Read Response or SEND payload straight into its MR);
//! bytes to send come out ([`Engine::fill_tx`], [`Engine::tx_gather`], [`Engine::tx_consumed`]):
//! the engine's own bytes and ranges of registered memory sent from the MR (with MPA CRC too:
//! the CRC is computed over them, see `tx_queue`).
//! The engine reads the QP's send and receive queues, places data into registered memory
//! after checking keys, PD, rights and bounds, and reports completions and async events as
//! values ([`Engine::take_outputs`]) for its driver to deliver. It never touches a socket, a
//! CQ, a clock or a thread, so every case runs in a unit test with two engines wired back to
//! back.
//!
//! Completion semantics (as Linux siw): a SEND or RDMA WRITE completes at the source once all
//! of its bytes were handed to the LLP, i.e. taken by the socket ([`Engine::tx_consumed`]); no
//! READ is ever sent to learn that they were placed. An RDMA READ completes when its last
//! Read Response segment was placed. Completions leave in posting order (IBTA in-order
//! completion): a SEND posted after a READ completes only after that READ's response. A
//! Terminate received later moves the QP to ERR; work not yet completed then flushes.
//! The start-up rules (peer-to-peer mode, RTR, who sends first) are in [`crate::handshake`].

mod inflight;
mod rx;
mod rx_direct;
mod term;
mod tx;
mod tx_queue;

#[cfg(test)]
mod plain_host_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod with_device_tests;
#[cfg(test)]
mod zero_copy_crc_tests;
#[cfg(test)]
mod zero_copy_tests;

use inflight::Inflight;
use softrdma_verbs::mr::MrInner;
use softrdma_verbs::qp_host::QpOutputs;
use softrdma_verbs::QpHost;
use softrdma_verbs::RecvWr;
use std::collections::VecDeque;
use std::sync::Arc;

pub use crate::handshake::Rtr;

pub use term::terminate_status;

/// Largest payload per DDP segment (keeps each ULPDU under the 16-bit MPA length).
pub const MAX_SEGMENT_PAYLOAD: usize = 65_536 - 64;
/// TX bytes the engine prepares ahead of the socket.
pub const TX_HIGH_WATER: usize = 512 * 1024;
/// The room for own TX bytes (headers, trailers, copied payloads) a new engine starts with.
const TX_OWN_START: usize = 4096;

/// Settings fixed at connection time.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// CRC32c on FPDUs.
    pub crc: bool,
    /// Incoming READs accepted at once.
    pub ird: u32,
    /// Outgoing READs outstanding at once.
    pub ord: u32,
    /// This side opened the connection.
    pub initiator: bool,
    /// Peer-to-peer mode: the RTR the initiator sends as its first FPDU (and the responder
    /// waits for before sending).
    pub rtr: Option<Rtr>,
}

/// Where the engine is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Moving data.
    Running,
    /// A Terminate is queued; no more data goes out; close once it is sent.
    Terminating,
    /// The QP is in ERR and everything is flushed; the stream should close.
    Closed,
}

/// A contiguous piece of a local buffer.
#[derive(Debug, Clone)]
pub(crate) struct Piece {
    mr: Arc<MrInner>,
    off: usize,
    len: usize,
}

/// Bytes of an outgoing message.
#[derive(Debug, Clone)]
pub(crate) enum Payload {
    Inline(Vec<u8>),
    Pieces(Vec<Piece>),
}

/// One message being segmented onto the wire.
#[derive(Debug)]
pub(crate) struct TxMsg {
    header: TxHeader,
    payload: Payload,
    total: usize,
    sent: usize,
    /// The in-flight entry this message completes (none for Read Responses).
    seq: Option<u64>,
}

#[derive(Debug, Clone, Copy)]
pub(crate) enum TxHeader {
    Untagged {
        opcode: softrdma_wire::Opcode,
        msn: u32,
        inval_stag: u32,
    },
    Tagged {
        opcode: softrdma_wire::Opcode,
        stag: u32,
        to: u64,
    },
}

/// An RDMA READ this side issued and awaits.
#[derive(Debug)]
pub(crate) struct OrqEntry {
    seq: u64,
    sink_to: u64,
    total: usize,
    placed: usize,
    dst: Vec<Piece>,
}

impl OrqEntry {
    /// The sink offset a Read Response segment for tagged offset `to` lands at.
    fn offset_of(&self, to: u64) -> usize {
        to.wrapping_sub(self.sink_to) as usize
    }

    /// Whether `len` bytes at sink offset `at` are the next ones and inside the sink.
    fn fits(&self, at: usize, len: usize) -> bool {
        at == self.placed && at.checked_add(len).is_some_and(|end| end <= self.total)
    }
}

/// A Read Response this side owes the peer.
#[derive(Debug)]
pub(crate) struct ReadResp {
    src: Option<Arc<MrInner>>,
    off: usize,
    len: usize,
    sink_stag: u32,
    sink_to: u64,
}

/// A SEND being received into a posted RECV.
#[derive(Debug)]
pub(crate) struct RecvInProgress {
    wqe: RecvWr,
    dst: Vec<Piece>,
    capacity: usize,
    received: usize,
}

/// Counters for tests, tools and benchmarks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// FPDUs sent.
    pub tx_fpdus: u64,
    /// FPDUs received.
    pub rx_fpdus: u64,
    /// Payload bytes placed into local memory.
    pub rx_placed: u64,
    /// Terminates sent.
    pub terminates_sent: u64,
    /// Terminates received.
    pub terminates_received: u64,
    /// Stream bytes the socket took (MPA framing included).
    pub tx_bytes: u64,
    /// Stream bytes read from the socket.
    pub rx_bytes: u64,
}

impl Stats {
    /// The counters in `softrdma stat`'s common shape (TCP does the retransmitting).
    pub fn counters(&self) -> softrdma_verbs::stats::QpCounters {
        softrdma_verbs::stats::QpCounters {
            tx_packets: self.tx_fpdus,
            rx_packets: self.rx_fpdus,
            tx_bytes: self.tx_bytes,
            rx_bytes: self.rx_bytes,
            errors: self.terminates_sent + self.terminates_received,
            ..Default::default()
        }
    }
}

/// The engine.
#[derive(Debug)]
pub struct Engine {
    qp: Arc<dyn QpHost>,
    cfg: EngineConfig,
    phase: Phase,
    // transmit
    txq: tx_queue::TxQueue,
    /// The stream broke mid-FPDU (see [`Engine::wants_reset`]).
    reset: bool,
    /// FPDUs may be produced (see [`Engine::release_tx`]).
    tx_enabled: bool,
    /// Responder in peer-to-peer mode: nothing is sent before the initiator's first FPDU.
    await_rtr: bool,
    /// Initiator in peer-to-peer mode: the RTR still has to go out first.
    rtr_pending: Option<Rtr>,
    cur: Option<TxMsg>,
    send_msn: u32,
    rreq_msn: u32,
    term_msn: u32,
    irq: VecDeque<ReadResp>,
    orq: VecDeque<OrqEntry>,
    inflight: Inflight,
    /// Completions, flushes and async events for the driver to deliver ([`Engine::take_outputs`]).
    out: QpOutputs,
    // receive
    rx: Vec<u8>,
    rx_len: usize,
    /// The last receive filled the buffer to its end (see `grow_rx`).
    rx_filled: bool,
    recv_msn: u32,
    rreq_msn_expected: u32,
    cur_recv: Option<RecvInProgress>,
    /// A payload (WRITE, Read Response, SEND) being received straight into its MR.
    direct: Option<rx_direct::Direct>,
    /// Bytes after a directly placed payload (its pad and CRC field) still to skip.
    rx_skip: usize,
    /// With MPA CRC: a directly placed payload whose pad and CRC field are still to check.
    crc_pending: Option<rx_direct::Direct>,
    /// Human-readable reason the engine stopped, if it did.
    pub close_reason: Option<String>,
    /// Counters.
    pub stats: Stats,
}

impl Engine {
    /// An engine for a QP whose connection just completed MPA setup.
    pub fn new(qp: Arc<dyn QpHost>, cfg: EngineConfig) -> Engine {
        let rtr_pending = cfg.rtr.filter(|_| cfg.initiator);
        Engine {
            qp,
            phase: Phase::Running,
            // Small at first: the own bytes are headers, trailers and payloads under
            // ZERO_COPY_MIN. Reserving TX_HIGH_WATER for every connection cost each a heap
            // extension (`brk`) and its page faults.
            txq: tx_queue::TxQueue::with_capacity(TX_OWN_START),
            reset: false,
            // Held until `release_tx` (the driver's timing, see `crate::handshake`) or the
            // peer's first FPDU, on both sides.
            tx_enabled: false,
            await_rtr: !cfg.initiator && cfg.rtr.is_some(),
            rtr_pending,
            cur: None,
            send_msn: 1,
            rreq_msn: 1,
            term_msn: 1,
            irq: VecDeque::new(),
            orq: VecDeque::new(),
            inflight: Inflight::default(),
            out: QpOutputs::default(),
            rx: vec![0u8; rx::RX_BUFFER_START],
            rx_len: 0,
            rx_filled: false,
            recv_msn: 1,
            rreq_msn_expected: 1,
            cur_recv: None,
            direct: None,
            rx_skip: 0,
            crc_pending: None,
            close_reason: None,
            stats: Stats::default(),
            cfg,
        }
    }

    /// The QP this engine serves.
    pub fn qp(&self) -> &Arc<dyn QpHost> {
        &self.qp
    }

    /// What the engine reported since the last call, oldest first: completions, flushes and
    /// async events. The driver delivers them to the QP ([`QpOutputs::deliver`]) before it
    /// lets another thread into the engine, so that they stay in order.
    pub fn take_outputs(&mut self) -> QpOutputs {
        self.out.take()
    }

    /// Where the engine is.
    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// True if posted work still awaits its completion (bytes not yet taken by the socket,
    /// READ data not yet arrived, or held behind such a READ).
    pub fn has_inflight(&self) -> bool {
        !self.inflight.is_empty()
    }

    /// True while FPDUs are held and only [`Engine::release_tx`] (not an RTR) can start them:
    /// a non-peer-to-peer responder before the initiator's first FPDU, or an initiator before
    /// its first FPDU (or RTR) was released.
    pub fn tx_release_pending(&self) -> bool {
        !self.tx_enabled && !self.await_rtr && self.phase == Phase::Running
    }

    /// Lets held FPDUs go (the driver decides when, see [`crate::handshake`]). A peer-to-peer
    /// responder still waits for the RTR.
    pub fn release_tx(&mut self) {
        if !self.await_rtr {
            self.tx_enabled = true;
        }
    }

    /// The QP moved to ERR (by the application or destroy): flush in order and stop.
    pub fn local_error(&mut self, reason: &str) {
        if self.phase == Phase::Closed {
            return;
        }
        self.fail_all(None, softrdma_verbs::WcStatus::WrFlushErr, 0, reason.to_string());
    }

    /// Bytes handed to the socket so far (a stream offset).
    pub fn tx_written(&self) -> u64 {
        self.txq.written()
    }

    /// The TCP stream ended or broke: flush everything with WR_FLUSH_ERR.
    pub fn peer_closed(&mut self, reason: &str) {
        if self.phase == Phase::Closed {
            return;
        }
        self.fail_all(None, softrdma_verbs::WcStatus::WrFlushErr, 0, reason.to_string());
    }

    /// Moves the QP to ERR: the named in-flight entry gets `status`, everything else flushes.
    pub(crate) fn fail_all(
        &mut self,
        target: Option<u64>,
        status: softrdma_verbs::WcStatus,
        vendor_err: u32,
        reason: String,
    ) {
        let qp = self.qp.clone();
        let running = self.phase == Phase::Running;
        let (sends, recvs) = qp.enter_error();
        if running && status != softrdma_verbs::WcStatus::WrFlushErr {
            // An error, not the end of the stream (a disconnect flushes, as in Linux siw).
            self.out.fatal();
        }
        self.inflight.fail(target, status, vendor_err, qp.qpn(), &mut self.out);
        self.orq.clear();
        self.irq.clear();
        if let Some(tx) = self.cur.take() {
            drop(tx);
        }
        let mut recvs_all: Vec<RecvWr> = Vec::new();
        if let Some(r) = self.cur_recv.take() {
            recvs_all.push(r.wqe);
        }
        self.direct = None;
        self.crc_pending = None;
        recvs_all.extend(recvs);
        self.out.flush(sends, recvs_all);
        if self.close_reason.is_none() {
            self.close_reason = Some(reason);
        }
        if self.phase == Phase::Running {
            self.phase = Phase::Closed;
        }
    }
}
