//! One side's verbs objects for a perf run, and completion helpers.

use softrdma_verbs::device::{self, DeviceInfo, TransportKind};
use softrdma_verbs::qp_state::{attr_mask, AttrRules};
use softrdma_verbs::*;
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// Send queue depth used by the bandwidth tests.
pub const DEPTH: u32 = 128;

/// PD, CQ and an RC QP in INIT, ready to connect.
pub struct Endpoint {
    pub pd: Pd,
    pub cq: Cq,
    pub qp: Qp,
    /// The CQ's completion channel when completions are waited for by events (`--events`).
    events: Option<CompChannel>,
}

/// Picks the device: `-d NAME`, else the one owning `ip`, else the first one.
pub fn pick_device(name: Option<&str>, ip: Option<IpAddr>) -> Result<DeviceInfo> {
    if let Some(n) = name {
        return device::find_device(n);
    }
    if let Some(d) = ip.filter(|ip| !ip.is_unspecified()).and_then(device::device_for_ip) {
        return Ok(d);
    }
    device::list_devices()?.into_iter().next().ok_or_else(|| {
        Error::new(
            Errno::NoDev,
            "no softrdma device: no interface is up with an address (see `softrdma devices`)",
        )
    })
}

impl Endpoint {
    /// `events`: completions are waited for on a completion channel instead of by polling.
    pub fn new(dev: &DeviceInfo, recv_depth: u32, events: bool) -> Result<Endpoint> {
        let ctx = Context::open(dev)?;
        let pd = ctx.alloc_pd()?;
        let events = if events { Some(ctx.create_comp_channel()?) } else { None };
        let cq = ctx.create_cq(4 * DEPTH + recv_depth + 16, events.as_ref())?;
        let cap = QpCap {
            max_send_wr: DEPTH,
            max_recv_wr: recv_depth.max(1),
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let init = QpInitAttr {
            send_cq: cq.clone(),
            recv_cq: cq.clone(),
            srq: None,
            cap,
            qp_type: QpType::Rc,
            sq_sig_all: false,
        };
        let attr = QpAttr {
            qp_state: Some(QpState::Init),
            qp_access_flags: Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
            port_num: 1,
            ..QpAttr::default()
        };
        let qp = match dev.transport {
            TransportKind::Iwarp => {
                let qp = Qp::new(&pd, init, AttrRules::Iwarp)?;
                qp.modify(&attr, attr_mask::STATE | attr_mask::ACCESS_FLAGS)?;
                qp
            }
            TransportKind::Roce => {
                let qp = softrdma_roce::driver::create_qp(&pd, init)?;
                let mask = attr_mask::STATE | attr_mask::ACCESS_FLAGS | attr_mask::PKEY_INDEX | attr_mask::PORT;
                qp.modify(&attr, mask)?;
                qp
            }
        };
        Ok(Endpoint { pd, cq, qp, events })
    }

    /// Waits for one completion (spinning, then yielding, or sleeping on the completion
    /// channel with `--events`); errors name the WR and status.
    pub fn next_wc(&self, timeout: Duration) -> Result<WorkCompletion> {
        let deadline = Instant::now() + timeout;
        let mut spins = 0u32;
        loop {
            let polled = match &self.events {
                Some(ch) => self.poll_or_sleep(ch, deadline)?,
                None => self.cq.poll_one(),
            };
            if let Some(wc) = polled {
                if wc.status != WcStatus::Success {
                    bail!(
                        Io,
                        "QP {}: work request {:#x} ({:?}) failed: {} (vendor_err {:#x})",
                        wc.qp_num,
                        wc.wr_id,
                        wc.opcode,
                        wc.status.as_str(),
                        wc.vendor_err
                    );
                }
                return Ok(wc);
            }
            spins += 1;
            if spins > SPINS || self.events.is_some() {
                if Instant::now() >= deadline {
                    bail!(TimedOut, "QP {}: no completion within {timeout:?}", self.qp.qpn());
                }
                if self.events.is_some() {
                    continue;
                }
                // On a 2-CPU machine a spinning poller starves the progress threads: back off.
                std::thread::sleep(BACKOFF);
            } else {
                std::hint::spin_loop();
            }
        }
    }
}

impl Endpoint {
    /// One completion if there is one; else arms the CQ, looks once more (a completion that
    /// arrived before the arming raises no event), and sleeps until the channel's next event.
    fn poll_or_sleep(&self, ch: &CompChannel, deadline: Instant) -> Result<Option<WorkCompletion>> {
        if let Some(wc) = self.cq.poll_one() {
            return Ok(Some(wc));
        }
        self.cq.req_notify(false)?;
        if let Some(wc) = self.cq.poll_one() {
            return Ok(Some(wc));
        }
        let left = deadline.saturating_duration_since(Instant::now());
        match ch.get_cq_event(Some(left)) {
            Ok(cq) => {
                cq.ack_events(1);
                Ok(self.cq.poll_one())
            }
            Err(e) if e.errno == Errno::Again => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Waits until every posted send has completed (the QP's send queue is empty).
    pub fn drain_sends(&self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        while self.qp.inner().sends_outstanding() > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            self.next_wc(left)?;
        }
        Ok(())
    }

    /// Like [`Endpoint::drain_sends`], for the last sends of a run: the peer may disconnect as
    /// soon as it has the data, so a WR_FLUSH_ERR here is expected, not a failure.
    pub fn drain_sends_after_peer(&self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        while self.qp.inner().sends_outstanding() > 0 {
            match self.cq.poll_one() {
                Some(wc) if wc.status == WcStatus::Success || wc.status == WcStatus::WrFlushErr => {}
                Some(wc) => bail!(
                    Io,
                    "QP {}: work request {:#x} failed: {}",
                    wc.qp_num,
                    wc.wr_id,
                    wc.status.as_str()
                ),
                None if Instant::now() >= deadline => bail!(
                    TimedOut,
                    "QP {}: sends still outstanding after {timeout:?}",
                    self.qp.qpn()
                ),
                None => std::thread::sleep(BACKOFF),
            }
        }
        Ok(())
    }

    /// Waits for the next receive completion; send completions met on the way are consumed.
    pub fn next_recv(&self, timeout: Duration) -> Result<WorkCompletion> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let wc = self.next_wc(left)?;
            if wc.opcode == WcOpcode::Recv {
                return Ok(wc);
            }
        }
    }
}

/// Spins until byte `off` of `mr` equals `want`; fails at once if `qp`'s connection goes down.
pub fn wait_byte(qp: &Qp, mr: &Mr, off: usize, want: u8, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    let mut spins = 0u32;
    while mr.read_byte_volatile(off) != Some(want) {
        spins += 1;
        if spins > SPINS {
            if qp.state() == QpState::Err && mr.read_byte_volatile(off) != Some(want) {
                bail!(
                    ConnReset,
                    "QP {}: the connection went down while waiting for an RDMA WRITE (byte {off} = {want})",
                    qp.qpn()
                );
            }
            if Instant::now() >= deadline {
                bail!(
                    TimedOut,
                    "no RDMA WRITE arrived within {timeout:?} (waiting for byte {off} = {want})"
                );
            }
            std::thread::sleep(BACKOFF);
        } else {
            std::hint::spin_loop();
        }
    }
    Ok(())
}

/// Busy-poll iterations before backing off.
const SPINS: u32 = 4000;
/// Back-off sleep once spinning found nothing.
const BACKOFF: Duration = Duration::from_micros(10);

/// Per-operation timeout inside a run.
pub const OP_TIMEOUT: Duration = Duration::from_secs(30);
