//! The active side of `softrdma perf`: runs the test per size and prints results.

use super::endpoint::{pick_device, wait_byte, Endpoint, DEPTH, OP_TIMEOUT};
use super::link;
use super::proto::{marker, pattern, Reply, Request};
use super::server::send_bw_window;
use super::{PerfArgs, Test};
use softrdma_verbs::{Access, Mr, SendFlags, SendWr};
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

/// Outcome of one size.
struct Outcome {
    elapsed: Duration,
    lat_us: Vec<f64>,
    verified: Option<bool>,
}

pub fn run(args: &PerfArgs, addr: IpAddr) -> crate::CmdResult {
    let dst = SocketAddr::new(addr, args.port);
    let dev = pick_device(args.device.as_deref(), Some(addr))?;
    let mut all_ok = true;
    if !args.json {
        println!(
            "# softrdma perf {} -> {dst} on {} ({} iterations)",
            args.test.name(),
            dev.name,
            args.iters
        );
    }
    for (i, &size) in args.size.iter().enumerate() {
        let last = i + 1 == args.size.len();
        let out = run_size(args, &dev, dst, size, last)
            .map_err(|e| format!("perf {} size {size} against {dst}: {e}", args.test.name()))?;
        report(args, size, &out);
        all_ok &= out.verified != Some(false);
    }
    if !all_ok {
        return Err("perf: data verification FAILED".into());
    }
    Ok(())
}

fn report(args: &PerfArgs, size: usize, out: &Outcome) {
    let secs = out.elapsed.as_secs_f64().max(1e-9);
    let mut obj = serde_json::json!({
        "test": args.test.name(),
        "size": size,
        "iterations": args.iters,
        "verified": out.verified.unwrap_or(false),
    });
    if args.test.is_bw() {
        let gbit = size as f64 * args.iters as f64 * 8.0 / secs / 1e9;
        let mps = args.iters as f64 / secs;
        obj["gbit_per_s"] = serde_json::json!(gbit);
        obj["msg_per_s"] = serde_json::json!(mps);
        if !args.json {
            println!(
                "{:>10} B  {:>10.3} Gbit/s  {:>12.0} msg/s  verified: {}",
                size,
                gbit,
                mps,
                verdict(out.verified)
            );
        }
    } else {
        let mut l = out.lat_us.clone();
        l.sort_by(|a, b| a.total_cmp(b));
        let pct = |p: f64| {
            l.get(((l.len() as f64 - 1.0) * p).round() as usize)
                .copied()
                .unwrap_or(0.0)
        };
        obj["p50_us"] = serde_json::json!(pct(0.5));
        obj["p99_us"] = serde_json::json!(pct(0.99));
        if !args.json {
            println!(
                "{:>10} B  p50 {:>9.2} us  p99 {:>9.2} us  verified: {}",
                size,
                pct(0.5),
                pct(0.99),
                verdict(out.verified)
            );
        }
    }
    if args.json {
        println!("{obj}");
    }
}

fn verdict(v: Option<bool>) -> &'static str {
    match v {
        Some(true) => "yes",
        Some(false) => "MISMATCH",
        None => "skipped",
    }
}

fn run_size(
    args: &PerfArgs,
    dev: &softrdma_verbs::device::DeviceInfo,
    dst: SocketAddr,
    size: usize,
    last: bool,
) -> Result<Outcome, Box<dyn std::error::Error>> {
    let ep = Endpoint::new(dev, 4, args.events)?;
    let local = ep
        .pd
        .alloc_mr(size, Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ)?;
    let req = Request {
        test: args.test,
        last,
        verify: !args.no_verify,
        size: size as u32,
        iters: args.iters,
        addr: local.addr(),
        rkey: local.rkey(),
    };
    let timeout = Duration::from_millis(args.timeout_ms);
    let (link, pd) = link::connect(&ep, dev, dst, req.encode(), args.mpa_crc, timeout)?;
    let reply = Reply::decode(&pd)?;
    let verify = !args.no_verify;
    let out = match args.test {
        Test::WriteBw => write_bw(&ep, &local, &reply, args.iters, verify),
        Test::ReadBw => read_bw(&ep, &local, &reply, args.iters, verify),
        Test::SendBw => send_bw(&ep, &local, args.iters, verify),
        Test::SendLat => send_lat(&ep, &local, args.iters, verify),
        Test::WriteLat => write_lat(&ep, &local, &reply, args.iters, verify),
        Test::ReadLat => read_lat(&ep, &local, &reply, args.iters, verify),
    };
    link.hang_up();
    Ok(out?)
}

/// Posts `iters` one-SGE WRs built by `make`, signaling every 16th and the last; keeps the queue full.
fn stream(ep: &Endpoint, iters: u32, make: impl Fn(u32) -> SendWr) -> softrdma_verbs::Result<Duration> {
    const BATCH: u32 = 16;
    let max_batches = DEPTH / BATCH - 1;
    let start = Instant::now();
    let (mut posted, mut batches_out) = (0u32, 0u32);
    while posted < iters {
        while batches_out >= max_batches {
            ep.next_wc(OP_TIMEOUT)?;
            batches_out -= 1;
        }
        let mut wr = make(posted);
        posted += 1;
        let signal = posted % BATCH == 0 || posted == iters;
        wr.flags = if signal { SendFlags::SIGNALED } else { SendFlags(0) };
        ep.qp.post_send_one(wr)?;
        if signal {
            batches_out += 1;
        }
    }
    while batches_out > 0 {
        ep.next_wc(OP_TIMEOUT)?;
        batches_out -= 1;
    }
    Ok(start.elapsed())
}

fn write_bw(ep: &Endpoint, local: &Mr, r: &Reply, iters: u32, verify: bool) -> softrdma_verbs::Result<Outcome> {
    let size = local.len() as u32;
    local.write(0, &pattern(size as usize, 1))?;
    let elapsed = stream(ep, iters, |i| {
        SendWr::write(i as u64, vec![local.sge(0, size)], r.addr, r.rkey)
    })?;
    let verified = verify.then(|| verify_write(ep, local, r)).transpose()?;
    Ok(Outcome {
        elapsed,
        lat_us: Vec::new(),
        verified,
    })
}

/// Writes a fresh pattern, reads it back through the server, compares.
fn verify_write(ep: &Endpoint, local: &Mr, r: &Reply) -> softrdma_verbs::Result<bool> {
    let size = local.len();
    let want = pattern(size, 7777);
    local.write(0, &want)?;
    ep.qp
        .post_send_one(SendWr::write(1, vec![local.sge(0, size as u32)], r.addr, r.rkey))?;
    ep.next_wc(OP_TIMEOUT)?;
    local.write(0, &vec![0u8; size])?;
    ep.qp
        .post_send_one(SendWr::read(2, vec![local.sge(0, size as u32)], r.addr, r.rkey))?;
    ep.next_wc(OP_TIMEOUT)?;
    Ok(local.to_vec() == want)
}

fn read_bw(ep: &Endpoint, local: &Mr, r: &Reply, iters: u32, verify: bool) -> softrdma_verbs::Result<Outcome> {
    let size = local.len() as u32;
    let elapsed = stream(ep, iters, |i| {
        SendWr::read(i as u64, vec![local.sge(0, size)], r.addr, r.rkey)
    })?;
    let verified = verify.then(|| local.to_vec() == pattern(size as usize, 0));
    Ok(Outcome {
        elapsed,
        lat_us: Vec::new(),
        verified,
    })
}

fn send_bw(ep: &Endpoint, local: &Mr, iters: u32, verify: bool) -> softrdma_verbs::Result<Outcome> {
    let size = local.len();
    let window = send_bw_window(size);
    // Slot k of every window carries pattern(size, k); a window's slots are reused only after
    // the server's credit proves it consumed them.
    let src = ep.pd.alloc_mr(size * window as usize, Access::LOCAL_WRITE)?;
    for k in 0..window as usize {
        src.write(k * size, &pattern(size, k as u32))?;
    }
    let credit = ep.pd.alloc_mr(4, Access::LOCAL_WRITE)?;
    ep.qp.post_recv_one(0, credit.sge(0, 4))?;
    let mut ok = true;
    let start = Instant::now();
    let mut sent = 0u32;
    while sent < iters {
        let n = window.min(iters - sent);
        for k in 0..n {
            let mut wr = SendWr::send((sent + k) as u64, vec![src.sge(k as usize * size, size as u32)]);
            wr.flags = if k + 1 == n { SendFlags::SIGNALED } else { SendFlags(0) };
            ep.qp.post_send_one(wr)?;
        }
        sent += n;
        ep.next_recv(OP_TIMEOUT)?;
        let mut c = [0u8; 4];
        credit.read(0, &mut c)?;
        ok &= c[0] == 1;
        ep.qp.post_recv_one(0, credit.sge(0, 4))?;
    }
    let elapsed = start.elapsed();
    Ok(Outcome {
        elapsed,
        lat_us: Vec::new(),
        verified: verify.then_some(ok),
    })
}

fn send_lat(ep: &Endpoint, local: &Mr, iters: u32, verify: bool) -> softrdma_verbs::Result<Outcome> {
    let size = local.len();
    let rbuf = ep.pd.alloc_mr(size, Access::LOCAL_WRITE)?;
    let mut lat = Vec::with_capacity(iters as usize);
    let mut ok = true;
    let mut echo = vec![0u8; size];
    let start = Instant::now();
    for i in 0..iters {
        let data = pattern(size, i);
        local.write(0, &data)?;
        ep.qp.post_recv_one(i as u64, rbuf.sge(0, size as u32))?;
        let t = Instant::now();
        ep.qp
            .post_send_one(SendWr::send(i as u64, vec![local.sge(0, size as u32)]))?;
        ep.next_recv(OP_TIMEOUT)?;
        lat.push(t.elapsed().as_secs_f64() * 1e6 / 2.0);
        if verify {
            rbuf.read(0, &mut echo)?;
            ok &= echo == data;
        }
    }
    ep.drain_sends(OP_TIMEOUT)?;
    Ok(Outcome {
        elapsed: start.elapsed(),
        lat_us: lat,
        verified: verify.then_some(ok),
    })
}

fn write_lat(ep: &Endpoint, local: &Mr, r: &Reply, iters: u32, verify: bool) -> softrdma_verbs::Result<Outcome> {
    let size = local.len();
    let src = ep.pd.alloc_mr(size, Access::LOCAL_WRITE)?;
    let mut lat = Vec::with_capacity(iters as usize);
    let mut last = Vec::new();
    let start = Instant::now();
    for i in 0..iters {
        let mut data = pattern(size, i);
        data[size - 1] = marker(i);
        src.write(0, &data)?;
        let mut wr = SendWr::write(i as u64, vec![src.sge(0, size as u32)], r.addr, r.rkey);
        let signal = i % 64 == 63 || i + 1 == iters;
        wr.flags = if signal { SendFlags::SIGNALED } else { SendFlags(0) };
        let t = Instant::now();
        ep.qp.post_send_one(wr)?;
        wait_byte(&ep.qp, local, size - 1, marker(i), OP_TIMEOUT)?;
        lat.push(t.elapsed().as_secs_f64() * 1e6 / 2.0);
        if signal {
            ep.next_wc(OP_TIMEOUT)?;
        }
        last = data;
    }
    let verified = verify.then(|| local.to_vec() == last);
    Ok(Outcome {
        elapsed: start.elapsed(),
        lat_us: lat,
        verified,
    })
}

fn read_lat(ep: &Endpoint, local: &Mr, r: &Reply, iters: u32, verify: bool) -> softrdma_verbs::Result<Outcome> {
    let size = local.len();
    let mut lat = Vec::with_capacity(iters as usize);
    let start = Instant::now();
    for i in 0..iters {
        let t = Instant::now();
        ep.qp
            .post_send_one(SendWr::read(i as u64, vec![local.sge(0, size as u32)], r.addr, r.rkey))?;
        ep.next_wc(OP_TIMEOUT)?;
        lat.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let verified = verify.then(|| local.to_vec() == pattern(size, 0));
    Ok(Outcome {
        elapsed: start.elapsed(),
        lat_us: lat,
        verified,
    })
}
