//! The passive side of `softrdma perf`.

use super::endpoint::{pick_device, wait_byte, Endpoint, OP_TIMEOUT};
use super::link::{Acceptor, Incoming};
use super::proto::{marker, pattern, Reply, Request};
use super::{PerfArgs, Test};
use softrdma_verbs::{Access, Mr, SendWr};
use std::net::SocketAddr;
use std::time::Duration;

/// Receives in flight for send-bw.
pub fn send_bw_window(size: usize) -> u32 {
    ((16 << 20) / size.max(1)).clamp(4, 64) as u32
}

pub fn run(args: &PerfArgs) -> crate::CmdResult {
    let bind = SocketAddr::new(args.bind, args.port);
    let dev = pick_device(args.device.as_deref(), Some(args.bind))?;
    let acceptor = Acceptor::bind(&dev, bind)?;
    eprintln!("softrdma perf: listening on {}", acceptor.local_addr()?);
    loop {
        let req = acceptor.next(OP_TIMEOUT)?;
        let last = serve(args, &dev, req)?;
        if last {
            return Ok(());
        }
    }
}

/// Serves one connection; returns whether the client said it was the last.
fn serve(
    args: &PerfArgs,
    dev: &softrdma_verbs::device::DeviceInfo,
    req: Incoming,
) -> Result<bool, Box<dyn std::error::Error>> {
    let r = match Request::decode(req.private_data()) {
        Ok(r) => r,
        Err(e) => {
            let peer = req.peer();
            req.reject(b"softrdma perf: bad request");
            return Err(format!("perf server: rejected {peer}: {e}").into());
        }
    };
    let size = r.size as usize;
    let recv_depth = if r.test == Test::SendBw {
        send_bw_window(size)
    } else {
        2
    };
    let ep = Endpoint::new(dev, recv_depth, args.events)?;
    let slots = if r.test == Test::SendBw { recv_depth as usize } else { 1 };
    let buf = ep.pd.alloc_mr(
        size * slots,
        Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
    )?;
    if matches!(r.test, Test::ReadBw | Test::ReadLat) {
        buf.write(0, &pattern(size, 0))?;
    }
    if matches!(r.test, Test::SendBw | Test::SendLat) {
        for i in 0..slots {
            ep.qp.post_recv_one(i as u64, buf.sge(i * size, size as u32))?;
        }
    }
    let reply = Reply {
        addr: buf.addr(),
        rkey: buf.rkey(),
        len: (size * slots) as u32,
    };
    let mut link = req.accept(&ep, dev, reply.encode(), args.mpa_crc)?;
    let outcome = match r.test {
        Test::SendBw => serve_send_bw(&ep, &buf, &r, slots),
        Test::SendLat => serve_send_lat(&ep, &buf, &r),
        Test::WriteLat => serve_write_lat(&ep, &buf, &r),
        Test::WriteBw | Test::ReadBw | Test::ReadLat => Ok(()),
    };
    // Wait for the client to hang up (it verifies, then disconnects).
    link.wait_hangup(Duration::from_secs(600));
    outcome?;
    Ok(r.last)
}

/// send-bw: checks every message (slot k of a window carries pattern k), reposts, and
/// grants credit after each window.
fn serve_send_bw(ep: &Endpoint, buf: &Mr, r: &Request, slots: usize) -> softrdma_verbs::Result<()> {
    let size = r.size as usize;
    let credit = ep.pd.alloc_mr(4, Access::LOCAL_WRITE)?;
    let want: Vec<Vec<u8>> = if r.verify {
        (0..slots as u32).map(|k| pattern(size, k)).collect()
    } else {
        Vec::new()
    };
    let mut got = vec![0u8; size];
    let mut ok = true;
    for i in 0..r.iters {
        let wc = ep.next_recv(OP_TIMEOUT)?;
        let slot = wc.wr_id as usize;
        if r.verify {
            buf.read(slot * size, &mut got)?;
            ok &= wc.byte_len as usize == size && got == want[i as usize % slots];
        }
        ep.qp.post_recv_one(slot as u64, buf.sge(slot * size, size as u32))?;
        let window_done = (i as usize + 1).is_multiple_of(slots) || i + 1 == r.iters;
        if window_done {
            credit.write(0, &[ok as u8, 0, 0, 0])?;
            ep.qp.post_send_one(SendWr::send(u64::MAX, vec![credit.sge(0, 4)]))?;
        }
    }
    // Keep the credit buffer registered until its last SEND completed (or flushed: the client
    // may hang up as soon as it has what it needs).
    ep.drain_sends_after_peer(OP_TIMEOUT)
}

/// send-lat: echoes each message back.
fn serve_send_lat(ep: &Endpoint, buf: &Mr, r: &Request) -> softrdma_verbs::Result<()> {
    let size = r.size;
    let echo = ep.pd.alloc_mr(size as usize, Access::LOCAL_WRITE)?;
    let mut tmp = vec![0u8; size as usize];
    for _ in 0..r.iters {
        ep.next_recv(OP_TIMEOUT)?;
        buf.read(0, &mut tmp)?;
        echo.write(0, &tmp)?;
        ep.qp.post_recv_one(0, buf.sge(0, size))?;
        ep.qp.post_send_one(SendWr::send(1, vec![echo.sge(0, size)]))?;
    }
    ep.drain_sends_after_peer(OP_TIMEOUT)
}

/// write-lat: waits for each WRITE's last byte, then writes the buffer back.
fn serve_write_lat(ep: &Endpoint, buf: &Mr, r: &Request) -> softrdma_verbs::Result<()> {
    let size = r.size as usize;
    for i in 0..r.iters {
        wait_byte(&ep.qp, buf, size - 1, marker(i), OP_TIMEOUT)?;
        let mut wr = SendWr::write(1, vec![buf.sge(0, size as u32)], r.addr, r.rkey);
        wr.flags = softrdma_verbs::SendFlags(0);
        if i + 1 == r.iters || i % 64 == 63 {
            wr.flags = softrdma_verbs::SendFlags::SIGNALED;
        }
        let signaled = wr.flags.contains(softrdma_verbs::SendFlags::SIGNALED);
        ep.qp.post_send_one(wr)?;
        if signaled && i + 1 < r.iters {
            ep.next_wc(OP_TIMEOUT)?;
        }
    }
    // The client hangs up once the last WRITE landed; its completion may be a flush.
    ep.drain_sends_after_peer(OP_TIMEOUT)
}
