//! RC ping-pong with the Rust verbs API on soft-RoCE, as rdma-core's `ibv_rc_pingpong` does it:
//! verbs only, no connection manager. Two sides (threads here, processes or hosts in real life)
//! each open `rxe_lo`, create a PD, a CQ, a memory region and an RC QP, tell each other their
//! QP number, PSN and GID out of band (a channel here, a TCP socket in `ibv_rc_pingpong`), move
//! their QP through INIT, RTR and RTS, and then bounce messages: the client SENDs a ping, the
//! server checks every byte and SENDs back a pong, which the client checks.
//!
//! ```sh
//! cargo run -p softrdma-roce --example rc_pingpong [ROUND_TRIPS] [SIZE]   # default 1000 x 4096
//! ```
//!
//! Exits 0 only when every byte of every message arrived as sent. (On a soft-iWARP device,
//! `siw_*`, a QP reaches RTS only through an rdma_cm connection: see softrdma-cm's
//! `cm_client_server` example.)

use softrdma_roce::driver::create_qp;
use softrdma_verbs::device::{self, DeviceInfo, Gid};
use softrdma_verbs::qp_state::attr_mask::{
    ACCESS_FLAGS, AV, DEST_QPN, MAX_DEST_RD_ATOMIC, MAX_QP_RD_ATOMIC, MIN_RNR_TIMER, PATH_MTU, PKEY_INDEX, PORT,
    RETRY_CNT, RNR_RETRY, RQ_PSN, SQ_PSN, STATE, TIMEOUT,
};
use softrdma_verbs::{Access, AhAttr, Cq, Mr, Pd, Qp, QpAttr, QpInitAttr, QpState, SendWr, WcStatus, WorkCompletion};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Any failure of the example: a verbs call, a lost or corrupt message, a timeout.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// How long one completion may take before the run is declared failed.
const WAIT: Duration = Duration::from_secs(10);

/// What one side tells the other out of band (as `ibv_rc_pingpong`'s "LID/QPN/PSN/GID" line).
#[derive(Debug, Clone, Copy)]
struct Endpoint {
    qpn: u32,
    psn: u32,
    gid: [u8; 16],
}

/// One side's verbs objects. The MR holds the send buffer at `0..size` and the receive buffer
/// at `size..2*size`.
struct Side {
    _pd: Pd,
    cq: Cq,
    mr: Mr,
    qp: Qp,
    size: usize,
}

/// The message of round trip `i`: pings have even seeds, pongs odd ones.
fn pattern(size: usize, seed: u64) -> Vec<u8> {
    let s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (0..size).map(|i| (s >> (i % 8 * 8)) as u8 ^ i as u8).collect()
}

fn open_side(dev: &DeviceInfo, size: usize) -> Result<Side, BoxError> {
    let ctx = softrdma_verbs::Context::open(dev)?;
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq(16, None)?;
    let mr = pd.alloc_mr(2 * size, Access::LOCAL_WRITE)?;
    let init = QpInitAttr::rc(&cq, 4, 4);
    let qp = create_qp(&pd, init)?;
    let attr = QpAttr {
        qp_state: Some(QpState::Init),
        pkey_index: 0,
        port_num: 1,
        qp_access_flags: Access::LOCAL_WRITE,
        ..QpAttr::default()
    };
    qp.modify(&attr, STATE | PKEY_INDEX | PORT | ACCESS_FLAGS)?;
    Ok(Side {
        _pd: pd,
        cq,
        mr,
        qp,
        size,
    })
}

/// INIT → RTR (towards `remote`) → RTS, the attributes `ibv_rc_pingpong` uses.
fn connect(side: &Side, local_psn: u32, remote: Endpoint, sgid_index: u8) -> Result<(), BoxError> {
    let rtr = QpAttr {
        qp_state: Some(QpState::Rtr),
        path_mtu: 3, // 1024
        dest_qp_num: remote.qpn,
        rq_psn: remote.psn,
        max_dest_rd_atomic: 1,
        min_rnr_timer: 12,
        ah_attr: AhAttr {
            dgid: remote.gid,
            sgid_index,
            is_global: true,
            hop_limit: 64,
            port_num: 1,
            ..AhAttr::default()
        },
        ..QpAttr::default()
    };
    side.qp.modify(
        &rtr,
        STATE | AV | PATH_MTU | DEST_QPN | RQ_PSN | MAX_DEST_RD_ATOMIC | MIN_RNR_TIMER,
    )?;
    let rts = QpAttr {
        qp_state: Some(QpState::Rts),
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        sq_psn: local_psn,
        max_rd_atomic: 1,
        ..QpAttr::default()
    };
    side.qp.modify(
        &rts,
        STATE | TIMEOUT | RETRY_CNT | RNR_RETRY | SQ_PSN | MAX_QP_RD_ATOMIC,
    )?;
    Ok(())
}

/// The next completion, which must be a success with the given `wr_id`.
fn completion(cq: &Cq, wr_id: u64) -> Result<WorkCompletion, BoxError> {
    let wc = cq
        .wait_for(1, WAIT)
        .pop()
        .ok_or_else(|| format!("no completion for wr_id {wr_id} within {WAIT:?}"))?;
    if wc.status != WcStatus::Success || wc.wr_id != wr_id {
        return Err(format!("expected a successful completion of wr_id {wr_id}, got {wc:?}").into());
    }
    Ok(wc)
}

fn post_recv(side: &Side) -> Result<(), BoxError> {
    side.qp.post_recv_one(RECV, side.mr.sge(side.size, side.size as u32))?;
    Ok(())
}

fn send(side: &Side, data: &[u8]) -> Result<(), BoxError> {
    side.mr.write(0, data)?;
    side.qp
        .post_send_one(SendWr::send(SEND, vec![side.mr.sge(0, data.len() as u32)]))?;
    completion(&side.cq, SEND)?;
    Ok(())
}

/// Waits for the next receive and checks it is exactly `want`.
fn receive(side: &Side, want: &[u8], what: &str) -> Result<(), BoxError> {
    let wc = completion(&side.cq, RECV)?;
    let mut got = vec![0u8; wc.byte_len as usize];
    side.mr.read(side.size, &mut got)?;
    if got != want {
        let at = got
            .iter()
            .zip(want)
            .position(|(a, b)| a != b)
            .unwrap_or(got.len().min(want.len()));
        return Err(format!(
            "{what} is corrupt: {} bytes, expected {}, first difference at byte {at}",
            got.len(),
            want.len()
        )
        .into());
    }
    Ok(())
}

const SEND: u64 = 1;
const RECV: u64 = 2;

/// Runs `round_trips` verified ping-pongs of `size` bytes between two RC QPs on `rxe_lo` over
/// 127.0.0.1, and returns how long they took.
pub fn run(round_trips: u64, size: usize) -> Result<Duration, BoxError> {
    if size == 0 || size > 1 << 30 {
        return Err(format!("size {size} is out of range (1..=1 GiB)").into());
    }
    let dev = device::find_device("rxe_lo")?;
    let ip = IpAddr::V4(Ipv4Addr::LOCALHOST);
    let gid_index = dev.gid_index_of(ip).ok_or("rxe_lo has no GID for 127.0.0.1")?;
    let sgid_index = u8::try_from(gid_index)?;
    let gid = Gid::from_ip(ip).0;

    // The out-of-band exchange: each side sends its endpoint, then reads the other's.
    let (to_client, from_server) = mpsc::channel::<Endpoint>();
    let (to_server, from_client) = mpsc::channel::<Endpoint>();
    let server_dev = dev.clone();
    let server = std::thread::spawn(move || -> Result<(), BoxError> {
        let side = open_side(&server_dev, size)?;
        let psn = 0x00_5eed;
        post_recv(&side)?; // before the client can send
        to_client.send(Endpoint {
            qpn: side.qp.qpn(),
            psn,
            gid,
        })?;
        let client = from_client.recv_timeout(WAIT)?;
        connect(&side, psn, client, sgid_index)?;
        for i in 0..round_trips {
            receive(&side, &pattern(size, 2 * i), &format!("ping {i}"))?;
            post_recv(&side)?;
            send(&side, &pattern(size, 2 * i + 1))?;
        }
        Ok(())
    });

    let client = (|| -> Result<Duration, BoxError> {
        let side = open_side(&dev, size)?;
        let psn = 0x00_c11e;
        to_server.send(Endpoint {
            qpn: side.qp.qpn(),
            psn,
            gid,
        })?;
        let server = from_server.recv_timeout(WAIT)?;
        connect(&side, psn, server, sgid_index)?;
        let start = Instant::now();
        for i in 0..round_trips {
            post_recv(&side)?; // the pong's buffer, before the ping goes out
            send(&side, &pattern(size, 2 * i))?;
            receive(&side, &pattern(size, 2 * i + 1), &format!("pong {i}"))?;
        }
        Ok(start.elapsed())
    })();
    let server = server.join().map_err(|_| "the server thread panicked")?;
    match (client, server) {
        (Ok(elapsed), Ok(())) => Ok(elapsed),
        (Err(e), Ok(())) => Err(format!("client: {e}").into()),
        (Ok(_), Err(e)) => Err(format!("server: {e}").into()),
        (Err(c), Err(s)) => Err(format!("client: {c}; server: {s}").into()),
    }
}

fn arg(n: usize, default: u64) -> Result<u64, BoxError> {
    match std::env::args().nth(n) {
        None => Ok(default),
        Some(s) => s.parse().map_err(|e| format!("argument {n} `{s}`: {e}").into()),
    }
}

fn main() -> std::process::ExitCode {
    let result = (|| {
        let (round_trips, size) = (arg(1, 1000)?, arg(2, 4096)?);
        let size = usize::try_from(size)?;
        let t = run(round_trips, size)?;
        Ok::<_, BoxError>((round_trips, size, t))
    })();
    match result {
        Ok((n, size, t)) => {
            let per = t.as_secs_f64() * 1e6 / n.max(1) as f64;
            println!("{n} round trips of {size} bytes verified on rxe_lo in {t:.2?} ({per:.1} us per round trip)");
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("rc_pingpong: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
