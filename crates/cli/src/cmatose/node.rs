//! One cmatose connection: its CM id, its verbs resources (PD, a send and a receive CQ, an RC
//! QP, message buffers), posting, and completion polling with back-off.

use super::{Failure, Messages, STALL_TIMEOUT};
use softrdma_cm::CmId;
use softrdma_verbs::{Access, Cq, Mr, Pd, Qp, QpCap, QpInitAttr, QpType, SendWr, WcOpcode, WcStatus, WorkCompletion};
use std::time::{Duration, Instant};

/// A connection of the test (`struct cmatest_node`).
pub(crate) struct Node {
    /// Position in the test's node list.
    pub index: usize,
    /// The connection's CM id.
    pub id: CmId,
    /// ESTABLISHED seen and not yet disconnected by us.
    pub connected: bool,
    /// ESTABLISHED was seen.
    pub established: bool,
    /// DISCONNECTED was seen.
    pub down: bool,
    res: Option<Resources>,
}

/// Verbs objects of a node; message slot `i` of each buffer holds message `i`.
struct Resources {
    _pd: Pd,
    send_cq: Cq,
    recv_cq: Cq,
    qp: Qp,
    send_mr: Option<Mr>,
    recv_mr: Option<Mr>,
}

impl Node {
    /// A node for `id`, without resources yet.
    pub fn new(index: usize, id: CmId) -> Node {
        Node {
            index,
            id,
            connected: false,
            established: false,
            down: false,
            res: None,
        }
    }

    /// Names the node in messages: its index and peer.
    pub fn label(&self) -> String {
        match self.id.peer_addr() {
            Some(p) => format!("connection {} ({p})", self.index),
            None => format!("connection {}", self.index),
        }
    }

    fn fail(&self, what: &str, e: &softrdma_verbs::Error) -> Failure {
        Failure::verbs(&format!("{}: {what}", self.label()), e)
    }

    /// Creates the PD, CQs, QP and buffers (`init_node`) and posts every receive
    /// (`post_recvs`): on iWARP a SEND arriving with no receive posted ends the connection,
    /// so this runs before connect or accept.
    pub fn init(&mut self, msgs: Messages) -> Result<(), Failure> {
        let Some(ctx) = self.id.context() else {
            return Err(Failure::new(format!("{}: the CM id has no device", self.label())));
        };
        let pd = ctx.alloc_pd().map_err(|e| self.fail("alloc_pd", &e))?;
        let depth = msgs.count.max(1);
        let send_cq = ctx.create_cq(depth, None).map_err(|e| self.fail("create_cq", &e))?;
        let recv_cq = ctx.create_cq(depth, None).map_err(|e| self.fail("create_cq", &e))?;
        let init = QpInitAttr {
            send_cq: send_cq.clone(),
            recv_cq: recv_cq.clone(),
            srq: None,
            cap: QpCap {
                max_send_wr: depth,
                max_recv_wr: depth,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            qp_type: QpType::Rc,
            sq_sig_all: true,
        };
        let qp = self
            .id
            .create_qp(&pd, init)
            .map_err(|e| self.fail("rdma_create_qp", &e))?;
        let (send_mr, recv_mr) = if msgs.count == 0 {
            (None, None)
        } else {
            let len = msgs.count as usize * msgs.size as usize;
            let send = pd
                .alloc_mr(len, Access::LOCAL_WRITE)
                .map_err(|e| self.fail("reg_mr", &e))?;
            let mut buf = vec![0u8; msgs.size as usize];
            for i in 0..msgs.count {
                Messages::fill(i, &mut buf);
                send.write(slot(msgs, i), &buf)
                    .map_err(|e| self.fail("fill message", &e))?;
            }
            let recv = pd
                .alloc_mr(len, Access::LOCAL_WRITE)
                .map_err(|e| self.fail("reg_mr", &e))?;
            for i in 0..msgs.count {
                qp.post_recv_one(u64::from(i), recv.sge(slot(msgs, i), msgs.size))
                    .map_err(|e| self.fail("post_recv", &e))?;
            }
            (Some(send), Some(recv))
        };
        self.res = Some(Resources {
            _pd: pd,
            send_cq,
            recv_cq,
            qp,
            send_mr,
            recv_mr,
        });
        Ok(())
    }

    fn res(&self) -> Result<&Resources, Failure> {
        self.res
            .as_ref()
            .ok_or_else(|| Failure::new(format!("{}: no QP", self.label())))
    }

    /// Posts every message as a signaled SEND (`post_sends`).
    pub fn post_sends(&self, msgs: Messages) -> Result<(), Failure> {
        let res = self.res()?;
        let Some(mr) = &res.send_mr else { return Ok(()) };
        for i in 0..msgs.count {
            let wr = SendWr::send(u64::from(i), vec![mr.sge(slot(msgs, i), msgs.size)]);
            res.qp.post_send_one(wr).map_err(|e| self.fail("post_send", &e))?;
        }
        Ok(())
    }

    /// Waits for the completion of every SEND. With `after_disconnect`, flushed SENDs are
    /// counted, not failed: a SEND still queued (iWARP: not yet taken by the socket; RoCE: not
    /// yet acknowledged) when a peer that verified what it received disconnects is flushed.
    /// Returns how many were flushed.
    pub fn complete_sends(&self, msgs: Messages, after_disconnect: bool) -> Result<u32, Failure> {
        let res = self.res()?;
        let mut flushed = 0;
        for _ in 0..msgs.count {
            let wc = self.next_wc(&res.send_cq, "send", after_disconnect)?;
            if wc.status == WcStatus::WrFlushErr {
                flushed += 1;
            } else if wc.opcode != WcOpcode::Send {
                return Err(Failure::new(format!(
                    "{}: unexpected {:?} completion on the send CQ",
                    self.label(),
                    wc.opcode
                )));
            }
        }
        Ok(flushed)
    }

    /// Waits for every receive, in order, and checks its length (and with `--verify` its contents).
    pub fn complete_recvs(&self, msgs: Messages) -> Result<(), Failure> {
        let res = self.res()?;
        let Some(mr) = &res.recv_mr else { return Ok(()) };
        let mut got = vec![0u8; msgs.size as usize];
        for i in 0..msgs.count {
            let wc = self.next_wc(&res.recv_cq, "receive", false)?;
            if wc.opcode != WcOpcode::Recv || wc.wr_id != u64::from(i) || wc.byte_len != msgs.size {
                return Err(Failure::new(format!(
                    "{}: message {i}: got {:?} completion of receive {} with {} bytes, expected receive {i} of {} bytes",
                    self.label(),
                    wc.opcode,
                    wc.wr_id,
                    wc.byte_len,
                    msgs.size
                )));
            }
            if !msgs.verify {
                continue;
            }
            mr.read(slot(msgs, i), &mut got)
                .map_err(|e| self.fail("read message", &e))?;
            if let Some((off, want)) = Messages::mismatch(i, &got) {
                return Err(Failure::new(format!(
                    "{}: message {i} is corrupt at byte {off}: {:#04x}, expected {want:#04x}",
                    self.label(),
                    got[off]
                )));
            }
        }
        Ok(())
    }

    /// Polls `cq` with back-off until a completion arrives; a failed one is an error (a
    /// flushed one too, unless `flush_ok`).
    fn next_wc(&self, cq: &Cq, what: &str, flush_ok: bool) -> Result<WorkCompletion, Failure> {
        let mut backoff = Backoff::new(STALL_TIMEOUT);
        loop {
            if let Some(wc) = cq.poll_one() {
                let flush = flush_ok && wc.status == WcStatus::WrFlushErr;
                if wc.status != WcStatus::Success && !flush {
                    return Err(Failure::new(format!(
                        "{}: {what} {} failed: {} (vendor_err {:#x})",
                        self.label(),
                        wc.wr_id,
                        wc.status.as_str(),
                        wc.vendor_err
                    )));
                }
                return Ok(wc);
            }
            if !backoff.wait() {
                return Err(Failure::new(format!(
                    "{}: no {what} completion within {STALL_TIMEOUT:?}",
                    self.label()
                )));
            }
        }
    }

    /// Releases the QP and buffers, then the id (`destroy_node`). Every event of the id must
    /// already be acknowledged.
    pub fn destroy(mut self) -> Result<(), Failure> {
        let qp_result = self.id.destroy_qp();
        self.res = None;
        let label = self.label();
        qp_result.map_err(|e| Failure::verbs(&format!("{label}: rdma_destroy_qp"), &e))?;
        self.id
            .destroy()
            .map_err(|e| Failure::verbs(&format!("{label}: rdma_destroy_id"), &e))
    }
}

/// Byte offset of message slot `i`.
fn slot(msgs: Messages, i: u32) -> usize {
    i as usize * msgs.size as usize
}

/// Spin-then-sleep waiting: a few yields, then sleeps that grow to 1 ms, so a 2-CPU machine
/// keeps its progress threads running. `wait` returns false once `limit` passed.
pub(crate) struct Backoff {
    deadline: Instant,
    round: u32,
}

impl Backoff {
    /// A back-off that gives up after `limit`.
    pub fn new(limit: Duration) -> Backoff {
        Backoff {
            deadline: Instant::now() + limit,
            round: 0,
        }
    }

    /// Waits a little; false once the deadline passed.
    pub fn wait(&mut self) -> bool {
        if Instant::now() >= self.deadline {
            return false;
        }
        self.round = self.round.saturating_add(1);
        if self.round <= 64 {
            std::thread::yield_now();
        } else {
            let us = (u64::from(self.round - 64) * 10).min(1000);
            std::thread::sleep(Duration::from_micros(us));
        }
        true
    }
}
