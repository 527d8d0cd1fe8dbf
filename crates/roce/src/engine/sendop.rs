//! A send WR taken off the send queue: its checked buffers, its PSN range and its progress.

use super::local::{resolve, Payload, Piece};
use super::psn::Psn;
use super::{imm_to_wire, MAX_MESSAGE, MAX_MESSAGE_PACKETS};
use softrdma_verbs::qp::SendWqe;
use softrdma_verbs::{QpHost, SendFlags, WcOpcode, WcStatus, WorkCompletion, WrOpcode};

/// What the WR does on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OpKind {
    /// SEND, with optional immediate data (wire order) or a key to invalidate.
    Send { imm: Option<u32>, inv: Option<u32> },
    /// RDMA WRITE, with optional immediate data (wire order).
    Write { imm: Option<u32> },
    /// RDMA READ: one request, one response packet per PSN.
    Read,
    /// ATOMIC CMP_AND_SWP (`cmp_swap`) or FETCH_AND_ADD.
    Atomic { cmp_swap: bool },
}

/// Where a packet sits in its message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Position {
    /// The only packet.
    Only,
    /// First of several.
    First,
    /// Neither first nor last.
    Middle,
    /// Last of several.
    Last,
}

impl Position {
    /// Position of packet `k` of `n`.
    pub(crate) fn of(k: u32, n: u32) -> Position {
        match (k == 0, k + 1 >= n) {
            (true, true) => Position::Only,
            (true, false) => Position::First,
            (false, false) => Position::Middle,
            (false, true) => Position::Last,
        }
    }

    /// Last or only: the packet ends the message.
    pub(crate) fn ends(self) -> bool {
        matches!(self, Position::Only | Position::Last)
    }
}

/// Number of packets (PSNs) a message of `len` bytes uses at `mtu`: at least one.
pub(crate) fn packets_for(len: u64, mtu: usize) -> u64 {
    len.div_ceil(mtu as u64).max(1)
}

/// One send WR in the requester's queue.
#[derive(Debug)]
pub(crate) struct SendOp {
    /// From the WR.
    pub wr_id: u64,
    /// Completion opcode.
    pub wc_opcode: WcOpcode,
    /// A successful completion goes to the CQ.
    pub signaled: bool,
    /// IBV_SEND_SOLICITED.
    pub solicited: bool,
    /// The operation.
    pub kind: OpKind,
    /// Message length in bytes.
    pub len: u32,
    /// Remote address (RDMA and atomics).
    pub remote_addr: u64,
    /// Remote key (RDMA and atomics).
    pub rkey: u32,
    /// Compare value (CmpSwap) or addend (FetchAdd).
    pub compare_add: u64,
    /// Swap value (CmpSwap).
    pub swap: u64,
    /// SEND/WRITE source bytes.
    pub payload: Payload,
    /// READ sink or atomic result buffer.
    pub sink: Vec<Piece>,
    /// PSN of the first packet.
    pub first_psn: Psn,
    /// Packets (PSNs) the message uses; 0 for a WR that failed before reaching the wire.
    pub npkts: u32,
    /// Index of the next packet to (re)send; `npkts` when everything was sent.
    pub next_pkt: u32,
    /// READ response packets placed so far.
    pub placed_pkts: u32,
    /// A local error: the WR completes with this status once everything before it has.
    pub failed: Option<(WcStatus, String)>,
    /// A local operation (no packets): executed, then completed, once everything before it
    /// has completed.
    pub local: Option<LocalOp>,
}

/// A send-queue operation that sends nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LocalOp {
    /// BIND_MW (`ibv_bind_mw` or a BIND_MW WR).
    Bind(softrdma_verbs::wr::MwBind),
    /// LOCAL_INV of a memory window's rkey.
    Invalidate(u32),
}

impl SendOp {
    /// Prepares `wqe` to start at `first_psn`: checks its buffers and sizes. A WR that cannot
    /// be sent comes back with `failed` set and no PSNs.
    pub(crate) fn prepare(wqe: SendWqe, qp: &dyn QpHost, mtu: usize, first_psn: Psn) -> SendOp {
        let wr = &wqe.wr;
        let len = wr.total_len();
        let imm = || Some(imm_to_wire(wr.imm_data));
        let opcode = wr.opcode;
        let kind = match opcode {
            Some(WrOpcode::Send) => Ok(OpKind::Send { imm: None, inv: None }),
            Some(WrOpcode::SendWithImm) => Ok(OpKind::Send { imm: imm(), inv: None }),
            Some(WrOpcode::SendWithInv) => Ok(OpKind::Send {
                imm: None,
                inv: Some(wr.invalidate_rkey),
            }),
            Some(WrOpcode::RdmaWrite) => Ok(OpKind::Write { imm: None }),
            Some(WrOpcode::RdmaWriteWithImm) => Ok(OpKind::Write { imm: imm() }),
            Some(WrOpcode::RdmaRead) => Ok(OpKind::Read),
            Some(WrOpcode::AtomicCmpAndSwp) => Ok(OpKind::Atomic { cmp_swap: true }),
            Some(WrOpcode::AtomicFetchAndAdd) => Ok(OpKind::Atomic { cmp_swap: false }),
            other => Err(format!("opcode {other:?} is not supported on RC QPs")),
        };
        let mut op = SendOp {
            wr_id: wr.wr_id,
            wc_opcode: opcode.map_or(WcOpcode::Send, WrOpcode::wc_opcode),
            signaled: wqe.signaled,
            solicited: wr.flags.contains(SendFlags::SOLICITED),
            kind: OpKind::Read,
            len: 0,
            remote_addr: wr.remote_addr,
            rkey: wr.rkey,
            compare_add: wr.compare_add,
            swap: wr.swap,
            payload: Payload::Inline(Vec::new()),
            sink: Vec::new(),
            first_psn,
            npkts: 0,
            next_pkt: 0,
            placed_pkts: 0,
            failed: None,
            local: None,
        };
        if matches!(opcode, Some(WrOpcode::BindMw | WrOpcode::LocalInv)) {
            // Sends nothing; not a READ/atomic for the ORD count.
            op.kind = OpKind::Send { imm: None, inv: None };
        }
        match (opcode, wr.bind) {
            (Some(WrOpcode::BindMw), Some(b)) => {
                op.local = Some(LocalOp::Bind(b));
                return op;
            }
            (Some(WrOpcode::BindMw), None) => {
                return op.fail(WcStatus::LocQpOpErr, "a BIND_MW WR without its bind".into());
            }
            (Some(WrOpcode::LocalInv), _) => {
                op.local = Some(LocalOp::Invalidate(wr.invalidate_rkey));
                return op;
            }
            _ => {}
        }
        let kind = match kind {
            Ok(k) => k,
            Err(why) => return op.fail(WcStatus::LocQpOpErr, why),
        };
        op.kind = kind;
        if len > MAX_MESSAGE {
            return op.fail(
                WcStatus::LocLenErr,
                format!("{len} bytes exceed the 2^31-byte message limit"),
            );
        }
        let pkts = match kind {
            OpKind::Atomic { .. } => 1,
            _ => packets_for(len, mtu),
        };
        if pkts > MAX_MESSAGE_PACKETS {
            return op.fail(
                WcStatus::LocLenErr,
                format!("{len} bytes need {pkts} packets at MTU {mtu}; at most {MAX_MESSAGE_PACKETS} allowed"),
            );
        }
        op.len = len as u32;
        let checked = match (kind, wqe.inline) {
            (OpKind::Read | OpKind::Atomic { .. }, _) => resolve(&wr.sg_list, qp, true).map(|p| op.sink = p),
            (_, Some(data)) => {
                op.payload = Payload::Inline(data);
                Ok(())
            }
            (_, None) => resolve(&wr.sg_list, qp, false).map(|p| op.payload = Payload::Pieces(p)),
        };
        if let Err(e) = checked {
            return op.fail(WcStatus::LocProtErr, format!("SGE {e}"));
        }
        if let OpKind::Atomic { .. } = kind {
            if op.len != 8 {
                let why = format!("atomic result buffer of {} bytes", op.len);
                return op.fail(WcStatus::LocLenErr, why);
            }
        }
        op.npkts = pkts as u32;
        op
    }

    fn fail(mut self, status: WcStatus, why: String) -> SendOp {
        self.npkts = 0;
        self.failed = Some((status, why));
        self
    }

    /// PSN after the last packet.
    pub(crate) fn end_psn(&self) -> Psn {
        self.first_psn.add(self.npkts)
    }

    /// PSN of the last packet (the first one for a failed op).
    pub(crate) fn last_psn(&self) -> Psn {
        self.first_psn.add(self.npkts.saturating_sub(1))
    }

    /// True if `psn` is one of this op's PSNs.
    pub(crate) fn contains(&self, psn: Psn) -> bool {
        psn.in_range(self.first_psn, self.npkts)
    }

    /// RDMA READ or atomic: answered by data, limited by ORD.
    pub(crate) fn is_rd_atomic(&self) -> bool {
        matches!(self.kind, OpKind::Read | OpKind::Atomic { .. })
    }

    /// A completion of this WR with `status`.
    pub(crate) fn completion(&self, status: WcStatus, qpn: u32) -> WorkCompletion {
        let mut wc = WorkCompletion::new(self.wr_id, status, self.wc_opcode, qpn);
        if status == WcStatus::Success {
            wc.byte_len = self.len;
        }
        wc
    }
}
