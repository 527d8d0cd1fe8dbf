//! The rping client (`rping_run_client` / `rping_test_client`).

use super::conn::{wait_event, Cb, Debug, Got};
use super::proto::{c_str, fill_ping, next_char, RdmaInfo, START};
use super::{RpingArgs, STEP_TIMEOUT};
use crate::cmatose::resolve_host;
use softrdma_cm::{CmId, ConnParam, EventChannel, EventType, PortSpace};
use softrdma_verbs::{Mr, WcOpcode};

/// `rdma_resolve_addr` / `rdma_resolve_route` timeout, as rping.
const RESOLVE_TIMEOUT_MS: i32 = 2000;

/// Resolves, connects, pings `-C` times (forever with 0), disconnects.
pub fn run(args: &RpingArgs) -> Result<(), String> {
    let debug = Debug(args.debug);
    let Some(server) = args.addr.as_deref() else {
        return Err("the client needs the server's address (-a ADDR)".into());
    };
    let dst = resolve_host(server, args.port).map_err(|f| f.reason)?;
    let src = match args.source.as_deref() {
        Some(s) => Some(resolve_host(s, 0).map_err(|f| f.reason)?),
        None => None,
    };
    let cm = EventChannel::new().map_err(|e| format!("rdma_create_event_channel: {e}"))?;
    let id = CmId::create(Some(&cm), PortSpace::Tcp).map_err(|e| format!("rdma_create_id: {e}"))?;
    debug.log("created cm_id");
    // rping_bind_client: address, then route.
    let resolved = id
        .resolve_addr(src, dst, RESOLVE_TIMEOUT_MS)
        .map_err(|e| format!("rdma_resolve_addr: {e}"))
        .and_then(|()| wait_event(&cm, EventType::AddrResolved, Some(STEP_TIMEOUT), "client", debug))
        .and_then(|_| {
            id.resolve_route(RESOLVE_TIMEOUT_MS)
                .map_err(|e| format!("rdma_resolve_route: {e}"))
        })
        .and_then(|()| wait_event(&cm, EventType::RouteResolved, Some(STEP_TIMEOUT), "client", debug));
    if let Err(e) = resolved {
        let _ = id.destroy();
        return Err(e);
    }
    debug.log("rdma_resolve_addr - rdma_resolve_route successful");
    let mut cb = match Cb::setup(cm, id.clone(), args.size, "client", debug) {
        Ok(cb) => cb,
        Err(e) => {
            let _ = id.destroy();
            return Err(format!("setup_qp failed: {e}"));
        }
    };
    let result = connect(&cb).and_then(|()| test_client(&mut cb, args));
    let ended = match &result {
        Ok(()) => cb.disconnect(false),
        Err(_) => {
            let _ = cb.id.disconnect();
            Ok(())
        }
    };
    let destroyed = cb.destroy();
    result.and(ended).and(destroyed)
}

/// Posts the receive, connects (IRD = ORD = 1, as rping) and waits for ESTABLISHED.
fn connect(cb: &Cb) -> Result<(), String> {
    cb.post_recv()?;
    let param = ConnParam {
        responder_resources: 1,
        initiator_depth: 1,
        retry_count: 7,
        rnr_retry_count: 7,
        ..ConnParam::default()
    };
    cb.id.connect(&param).map_err(|e| format!("rdma_connect: {e}"))?;
    wait_event(&cb.cm, EventType::Established, Some(STEP_TIMEOUT), "client", cb.debug)?;
    cb.debug.log("rdma_connect successful");
    Ok(())
}

/// The ping loop.
fn test_client(cb: &mut Cb, args: &RpingArgs) -> Result<(), String> {
    let size = args.size as usize;
    let mut start_char = START;
    let mut buf = vec![0u8; size];
    let mut ping = 0u32;
    while args.count == 0 || ping < args.count {
        fill_ping(&mut buf, ping, start_char);
        start_char = next_char(start_char);
        let start_mr = cb.start_mr.as_ref().ok_or("the client has no start buffer")?;
        start_mr.write(0, &buf).map_err(|e| format!("start_buf: {e}"))?;
        cb.send_info(info_of(start_mr, args.size))?;
        // Wait for the server to read the start buffer.
        go_ahead(cb, ping)?;
        cb.send_info(info_of(&cb.rdma_mr, args.size))?;
        // Wait for the server to write the sink.
        go_ahead(cb, ping)?;
        let sink = cb.rdma_mr.to_vec();
        if args.validate && sink != buf {
            let at = sink.iter().zip(&buf).position(|(a, b)| a != b).unwrap_or(0);
            return Err(format!("data mismatch! (ping {ping}, first difference at byte {at})"));
        }
        if args.verbose {
            println!("ping data: {}", c_str(&sink));
        }
        ping = ping.wrapping_add(1);
    }
    Ok(())
}

/// Waits for the server's go-ahead SEND (and reposts the receive).
fn go_ahead(cb: &mut Cb, ping: u32) -> Result<(), String> {
    match cb.wait(WcOpcode::Recv)? {
        Got::Wc(wc) => cb.take_info(&wc).map(drop),
        Got::Disconnected => Err(format!("the server disconnected during ping {ping}")),
    }
}

fn info_of(mr: &Mr, size: u32) -> RdmaInfo {
    RdmaInfo {
        buf: mr.addr(),
        rkey: mr.rkey(),
        size,
    }
}
