//! rping's control block (`struct rping_cb`): the CM channel and connection id, the verbs
//! resources, and waiting for completions (through a completion channel) and CM events at
//! once, from one thread.

use super::proto::RdmaInfo;
use super::STEP_TIMEOUT;
use softrdma_cm::{CmEvent, CmId, EventChannel, EventType};
use softrdma_verbs::{
    Access, CompChannel, Cq, Errno, Mr, Pd, Qp, QpInitAttr, SendWr, WcOpcode, WcStatus, WorkCompletion,
};
use std::time::{Duration, Instant};

/// Send queue depth (`RPING_SQ_DEPTH`).
const SQ_DEPTH: u32 = 16;

/// Longest block on the completion channel before CM events are looked at again.
const SLICE: Duration = Duration::from_millis(10);

/// What a wait produced.
pub(crate) enum Got {
    /// A successful completion of the wanted kind.
    Wc(WorkCompletion),
    /// The connection went down (DISCONNECTED).
    Disconnected,
}

/// Prints rping's `DEBUG_LOG` lines when `-d` is given.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Debug(pub bool);

impl Debug {
    /// Prints `msg` in debug mode.
    pub fn log(self, msg: impl std::fmt::Display) {
        if self.0 {
            println!("{msg}");
        }
    }
}

/// One side's connection and resources.
pub(crate) struct Cb {
    pub debug: Debug,
    /// "server" or "client", for messages.
    pub role: &'static str,
    pub cm: EventChannel,
    /// The connected id (the client's id, or the server's child id).
    pub id: CmId,
    pub qp: Qp,
    cq: Cq,
    comp: CompChannel,
    _pd: Pd,
    /// Where the peer's `rping_rdma_info` lands.
    pub recv_mr: Mr,
    /// What this side SENDs (an `rping_rdma_info`, or zeros for the server's go-ahead).
    pub send_mr: Mr,
    /// The RDMA buffer: the server's READ target and WRITE source; the client's sink.
    pub rdma_mr: Mr,
    /// The client's start buffer (RDMA READ source).
    pub start_mr: Option<Mr>,
}

fn verr(what: &str) -> impl Fn(softrdma_verbs::Error) -> String + '_ {
    move |e| format!("{what}: {e}")
}

impl Cb {
    /// `rping_setup_qp` and `rping_setup_buffers` on `id`: PD, completion channel, an armed
    /// CQ, the QP, and the four buffers (`start` only on the client).
    pub fn setup(cm: EventChannel, id: CmId, size: u32, role: &'static str, debug: Debug) -> Result<Cb, String> {
        let ctx = id.context().ok_or("the CM id has no device")?;
        let pd = ctx.alloc_pd().map_err(verr("ibv_alloc_pd"))?;
        let comp = ctx.create_comp_channel().map_err(verr("ibv_create_comp_channel"))?;
        let cq = ctx
            .create_cq(SQ_DEPTH * 2, Some(&comp))
            .map_err(verr("ibv_create_cq"))?;
        cq.req_notify(false).map_err(verr("ibv_req_notify_cq"))?;
        debug.log(format!("created pd, channel and cq on {}", ctx.device().name));
        let init = QpInitAttr::rc(&cq, SQ_DEPTH, 2);
        let qp = id.create_qp(&pd, init).map_err(verr("rdma_create_qp"))?;
        debug.log(format!("created qp {}", qp.qpn()));
        let remote = Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE;
        let len = RdmaInfo::LEN;
        let recv_mr = pd.alloc_mr(len, Access::LOCAL_WRITE).map_err(verr("recv_buf reg_mr"))?;
        let send_mr = pd.alloc_mr(len, Access::default()).map_err(verr("send_buf reg_mr"))?;
        let rdma_mr = pd.alloc_mr(size as usize, remote).map_err(verr("rdma_buf reg_mr"))?;
        let start_mr = match role {
            "client" => Some(pd.alloc_mr(size as usize, remote).map_err(verr("start_buf reg_mr"))?),
            _ => None,
        };
        debug.log("allocated & registered buffers...");
        Ok(Cb {
            debug,
            role,
            cm,
            id,
            qp,
            cq,
            comp,
            _pd: pd,
            recv_mr,
            send_mr,
            rdma_mr,
            start_mr,
        })
    }

    /// Posts the one receive (for the peer's next `rping_rdma_info`).
    pub fn post_recv(&self) -> Result<(), String> {
        self.qp
            .post_recv_one(0, self.recv_mr.sge(0, RdmaInfo::LEN as u32))
            .map_err(verr("ibv_post_recv"))
    }

    /// SENDs `info` (`rping_format_send` + post).
    pub fn send_info(&self, info: RdmaInfo) -> Result<(), String> {
        self.debug.log(format!(
            "RDMA addr {:x} rkey {:x} len {}",
            info.buf, info.rkey, info.size
        ));
        self.send_mr.write(0, &info.encode()).map_err(verr("send_buf"))?;
        self.send()
    }

    /// SENDs the send buffer as it is (the server's go-ahead).
    pub fn send(&self) -> Result<(), String> {
        let wr = SendWr::send(1, vec![self.send_mr.sge(0, RdmaInfo::LEN as u32)]);
        self.qp.post_send_one(wr).map_err(verr("post send error"))
    }

    /// Posts an RDMA READ or WRITE of `len` bytes of the RDMA buffer against `remote`.
    pub fn rdma(&self, write: bool, len: u32, remote: RdmaInfo) -> Result<(), String> {
        let sge = vec![self.rdma_mr.sge(0, len)];
        let wr = if write {
            SendWr::write(2, sge, remote.buf, remote.rkey)
        } else {
            SendWr::read(2, sge, remote.buf, remote.rkey)
        };
        self.qp.post_send_one(wr).map_err(verr("post send error"))
    }

    /// The `rping_rdma_info` of a receive completion; reposts the receive first, so the
    /// peer's next SEND always finds one.
    pub fn take_info(&self, wc: &WorkCompletion) -> Result<RdmaInfo, String> {
        if wc.byte_len as usize != RdmaInfo::LEN {
            return Err(format!("Received bogus data, size {}", wc.byte_len));
        }
        let mut b = [0u8; RdmaInfo::LEN];
        self.recv_mr.read(0, &mut b).map_err(verr("recv_buf"))?;
        self.post_recv()?;
        RdmaInfo::decode(&b).ok_or_else(|| "Received bogus data".to_string())
    }

    /// Waits for a completion of kind `want`; SEND completions met on the way are consumed.
    /// A DISCONNECTED event (or flushed work requests followed by it) ends the wait.
    pub fn wait(&mut self, want: WcOpcode) -> Result<Got, String> {
        let deadline = Instant::now() + STEP_TIMEOUT;
        loop {
            if let Some(got) = self.try_once(want)? {
                return Ok(got);
            }
            self.cq.req_notify(false).map_err(verr("ibv_req_notify_cq"))?;
            if let Some(got) = self.try_once(want)? {
                return Ok(got);
            }
            if Instant::now() >= deadline {
                return Err(format!("{}: no {want:?} completion within {STEP_TIMEOUT:?}", self.role));
            }
            match self.comp.get_cq_event(Some(SLICE)) {
                Ok(cq) => cq.ack_events(1),
                Err(e) if e.errno == Errno::Again => {}
                Err(e) => return Err(format!("Failed to get cq event: {e}")),
            }
        }
    }

    /// One look at the CQ, then at the CM channel.
    fn try_once(&mut self, want: WcOpcode) -> Result<Option<Got>, String> {
        while let Some(wc) = self.cq.poll_one() {
            if wc.status == WcStatus::WrFlushErr {
                self.debug.log(format!("flushed {:?} completion", wc.opcode));
                continue;
            }
            if wc.status != WcStatus::Success {
                return Err(format!(
                    "cq completion failed status {} ({}) for {:?} (vendor_err {:#x})",
                    wc.status as u32,
                    wc.status.as_str(),
                    wc.opcode,
                    wc.vendor_err
                ));
            }
            match wc.opcode {
                o if o == want => {
                    self.debug.log(format!("{o:?} completion"));
                    return Ok(Some(Got::Wc(wc)));
                }
                WcOpcode::Send => self.debug.log("send completion"),
                o => return Err(format!("unexpected {o:?} completion while waiting for {want:?}")),
            }
        }
        match self.cm.get_event(Some(Duration::ZERO)) {
            Ok(ev) => match on_event(ev, self.role, self.debug)? {
                Some(EventType::Disconnected) => Ok(Some(Got::Disconnected)),
                _ => Ok(None),
            },
            Err(e) if e.errno == Errno::Again => Ok(None),
            Err(e) => Err(format!("rdma_get_cm_event: {e}")),
        }
    }

    /// `rdma_disconnect` (if still connected), then waits briefly for DISCONNECTED.
    pub fn disconnect(&mut self, seen: bool) -> Result<(), String> {
        if let Err(e) = self.id.disconnect() {
            self.debug.log(format!("rdma_disconnect: {e}"));
        }
        if seen {
            return Ok(());
        }
        wait_event(
            &self.cm,
            EventType::Disconnected,
            Some(Duration::from_secs(5)),
            self.role,
            self.debug,
        )?;
        eprintln!("{} DISCONNECT EVENT...", self.role);
        Ok(())
    }

    /// Releases the QP, the buffers and the id (every event must be acknowledged).
    pub fn destroy(self) -> Result<(), String> {
        self.id.destroy_qp().map_err(verr("ibv_destroy_qp"))?;
        let Cb { id, .. } = self;
        id.destroy().map_err(verr("rdma_destroy_id"))
    }
}

/// `rping_cma_event_handler` for events outside the awaited one: error events fail, a second
/// connection request is refused (this server serves one client), DISCONNECTED is reported.
pub(crate) fn on_event(ev: CmEvent, role: &'static str, debug: Debug) -> Result<Option<EventType>, String> {
    debug.log(format!("cma_event type {} status {}", ev.event, ev.status));
    match ev.event {
        EventType::AddrError
        | EventType::RouteError
        | EventType::ConnectError
        | EventType::Unreachable
        | EventType::Rejected
        | EventType::DeviceRemoval => Err(format!(
            "cma event {}, error {}: {}",
            ev.event,
            ev.status,
            if ev.reason.is_empty() {
                "no reason given"
            } else {
                &ev.reason
            }
        )),
        EventType::ConnectRequest => {
            let child = ev.id.clone();
            drop(ev);
            eprintln!("{role}: refusing a second connection request (serving one client)");
            let _ = child.reject(b"rping: the server is busy with another client");
            let _ = child.destroy();
            Ok(None)
        }
        EventType::Disconnected => {
            eprintln!("{role} DISCONNECT EVENT...");
            Ok(Some(EventType::Disconnected))
        }
        other => Ok(Some(other)),
    }
}

/// Waits for CM event `want` (its id is returned); other events go through [`on_event`].
pub(crate) fn wait_event(
    cm: &EventChannel,
    want: EventType,
    timeout: Option<Duration>,
    role: &'static str,
    debug: Debug,
) -> Result<CmId, String> {
    let deadline = timeout.map(|t| Instant::now() + t);
    loop {
        let left = deadline.map(|d| {
            d.saturating_duration_since(Instant::now())
                .max(Duration::from_millis(1))
        });
        let ev = cm.get_event(left).map_err(|e| match e.errno {
            Errno::Again => format!("{role}: no {want} event within {:?}", timeout.unwrap_or_default()),
            _ => format!("rdma_get_cm_event: {e}"),
        })?;
        if ev.event == want {
            debug.log(format!("cma_event type {}", ev.event));
            return Ok(ev.id.clone());
        }
        if let Some(EventType::Disconnected) = on_event(ev, role, debug)? {
            return Err(format!("{role}: disconnected while waiting for {want}"));
        }
    }
}
