//! An rdma_cm client and server with softrdma-cm's Rust API, the shape of every librdmacm
//! program: the server listens on 127.0.0.1, the client resolves the address and the route,
//! both create a QP on the id's device and connect; then the client SENDs messages, the server
//! checks every byte and answers each, and the client disconnects.
//!
//! ```sh
//! cargo run -p softrdma-cm --example cm_client_server [--roce] [MESSAGES] [SIZE]   # default 100 x 1024
//! ```
//!
//! The device comes from the address, as with librdmacm: 127.0.0.1 is `siw_lo` (soft-iWARP),
//! unless `--roce` restricts both ids to RoCE devices (`rxe_lo`, the IB CM on UDP 4791). The
//! server runs in a thread here; in two processes the code is the same. Exits 0 only when every
//! message arrived intact both ways.

use softrdma_cm::{CmEvent, CmId, CmOption, ConnParam, EventChannel, EventType, PortSpace};
use softrdma_verbs::device::TransportKind;
use softrdma_verbs::{Access, Cq, Mr, Pd, Qp, QpInitAttr, SendWr, WcStatus, WorkCompletion};
use std::net::SocketAddr;
use std::sync::mpsc;
use std::time::Duration;

/// Any failure of the example: a CM or verbs call, an unexpected event, a corrupt message.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

const WAIT: Duration = Duration::from_secs(10);
const SEND: u64 = 1;
const RECV: u64 = 2;

/// The next event on `ch`, which must be `want` with status 0.
fn expect(ch: &EventChannel, want: EventType) -> Result<CmEvent, BoxError> {
    let ev = ch.get_event(Some(WAIT))?;
    if ev.event != want || ev.status != 0 {
        return Err(format!(
            "expected {want}, got {} (status {}: {})",
            ev.event, ev.status, ev.reason
        )
        .into());
    }
    Ok(ev)
}

/// The verbs objects of one connected side. The MR holds the send buffer at `0..size` and the
/// receive buffer at `size..2*size`.
struct Side {
    pd: Pd,
    cq: Cq,
    mr: Mr,
    qp: Qp,
    size: usize,
}

/// PD, CQ, MR and an RC QP on the id's device (`rdma_create_qp`).
fn side(id: &CmId, size: usize) -> Result<Side, BoxError> {
    let ctx = id.context().ok_or("the id has no device")?;
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq(16, None)?;
    let mr = pd.alloc_mr(2 * size, Access::LOCAL_WRITE)?;
    let init = QpInitAttr::rc(&cq, 4, 4);
    let qp = id.create_qp(&pd, init)?;
    Ok(Side { pd, cq, mr, qp, size })
}

impl Side {
    fn post_recv(&self) -> Result<(), BoxError> {
        self.qp.post_recv_one(RECV, self.mr.sge(self.size, self.size as u32))?;
        Ok(())
    }

    fn completion(&self, wr_id: u64) -> Result<WorkCompletion, BoxError> {
        let wc = self
            .cq
            .wait_for(1, WAIT)
            .pop()
            .ok_or_else(|| format!("no completion for wr_id {wr_id} within {WAIT:?}"))?;
        if wc.status != WcStatus::Success || wc.wr_id != wr_id {
            return Err(format!("expected a successful completion of wr_id {wr_id}, got {wc:?}").into());
        }
        Ok(wc)
    }

    fn send(&self, data: &[u8]) -> Result<(), BoxError> {
        self.mr.write(0, data)?;
        self.qp
            .post_send_one(SendWr::send(SEND, vec![self.mr.sge(0, data.len() as u32)]))?;
        self.completion(SEND)?;
        Ok(())
    }

    fn receive(&self, want: &[u8], what: &str) -> Result<(), BoxError> {
        let wc = self.completion(RECV)?;
        let mut got = vec![0u8; wc.byte_len as usize];
        self.mr.read(self.size, &mut got)?;
        if got != want {
            return Err(format!("{what} is corrupt ({} bytes, expected {})", got.len(), want.len()).into());
        }
        Ok(())
    }

    /// Destroys the id's QP, the id, then the CQ and PD (`rdma_destroy_qp`, `rdma_destroy_id`).
    fn teardown(self, id: CmId) -> Result<(), BoxError> {
        id.destroy_qp()?;
        id.destroy()?;
        drop((self.qp, self.mr));
        self.cq.destroy()?;
        self.pd.dealloc()?;
        Ok(())
    }
}

/// Message `i` from the client (even seeds) or the server's answer (odd seeds).
fn message(size: usize, seed: u64) -> Vec<u8> {
    (0..size as u64)
        .map(|i| (i.wrapping_mul(7) ^ seed.wrapping_mul(131)) as u8)
        .collect()
}

/// An id on `ch`, restricted to RoCE devices if `roce`.
fn new_id(ch: &EventChannel, roce: bool) -> Result<CmId, BoxError> {
    let id = CmId::create(Some(ch), PortSpace::Tcp)?;
    if roce {
        id.set_option(CmOption::Transport(Some(TransportKind::Roce)))?;
    }
    Ok(id)
}

fn server(roce: bool, messages: u64, size: usize, ready: mpsc::Sender<SocketAddr>) -> Result<(), BoxError> {
    let ch = EventChannel::new()?;
    let listener = new_id(&ch, roce)?;
    listener.bind_addr("127.0.0.1:0".parse()?)?; // port 0: the CM picks one
    listener.listen(1)?;
    ready.send(listener.local_addr().ok_or("the listener has no address")?)?;

    let req = expect(&ch, EventType::ConnectRequest)?;
    let id = req.id.clone();
    req.ack();
    let s = side(&id, size)?;
    s.post_recv()?; // before accept: the client may send as soon as it is ESTABLISHED
    id.accept(None)?;
    expect(&ch, EventType::Established)?.ack();
    for i in 0..messages {
        s.receive(&message(size, 2 * i), &format!("message {i}"))?;
        s.post_recv()?;
        s.send(&message(size, 2 * i + 1))?;
    }
    expect(&ch, EventType::Disconnected)?.ack();
    s.teardown(id)?;
    listener.destroy()?;
    Ok(())
}

fn client(roce: bool, messages: u64, size: usize, addr: SocketAddr) -> Result<(), BoxError> {
    let ch = EventChannel::new()?;
    let id = new_id(&ch, roce)?;
    id.resolve_addr(None, addr, 2000)?;
    expect(&ch, EventType::AddrResolved)?.ack();
    id.resolve_route(2000)?;
    expect(&ch, EventType::RouteResolved)?.ack();
    let device = id.device().ok_or("no device after resolve_route")?.name;
    let s = side(&id, size)?;
    s.post_recv()?;
    id.connect(&ConnParam::default())?;
    expect(&ch, EventType::Established)?.ack();
    for i in 0..messages {
        s.send(&message(size, 2 * i))?;
        s.receive(&message(size, 2 * i + 1), &format!("answer {i}"))?;
        s.post_recv()?;
    }
    id.disconnect()?;
    expect(&ch, EventType::Disconnected)?.ack();
    s.teardown(id)?;
    println!("{messages} messages of {size} bytes each way verified over {device} ({addr})");
    Ok(())
}

/// Runs the server (in a thread) and the client: `messages` verified exchanges of `size` bytes.
pub fn run(roce: bool, messages: u64, size: usize) -> Result<(), BoxError> {
    if size == 0 || size > 1 << 30 {
        return Err(format!("size {size} is out of range (1..=1 GiB)").into());
    }
    let (ready, listening) = mpsc::channel();
    let srv = std::thread::spawn(move || server(roce, messages, size, ready));
    // If the server failed before listening, its error is the one to report.
    let result = match listening.recv_timeout(WAIT) {
        Ok(addr) => client(roce, messages, size, addr),
        Err(e) => Err(format!("the server did not start listening: {e}").into()),
    };
    let served = srv.join().map_err(|_| "the server thread panicked")?;
    both(result, served)
}

/// The client's and the server's outcome as one: either failure, or both.
fn both(client: Result<(), BoxError>, server: Result<(), BoxError>) -> Result<(), BoxError> {
    match (client, server) {
        (Ok(()), Ok(())) => Ok(()),
        (Err(e), Ok(())) => Err(format!("client: {e}").into()),
        (Ok(()), Err(e)) => Err(format!("server: {e}").into()),
        (Err(c), Err(s)) => Err(format!("client: {c}; server: {s}").into()),
    }
}

fn main() -> std::process::ExitCode {
    let result = (|| {
        let mut args: Vec<String> = std::env::args().skip(1).collect();
        let roce = args.first().is_some_and(|a| a == "--roce");
        if roce {
            args.remove(0);
        }
        let messages = args.first().map_or(Ok(100), |s| s.parse())?;
        let size = args.get(1).map_or(Ok(1024), |s| s.parse())?;
        run(roce, messages, size)
    })();
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cm_client_server: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
