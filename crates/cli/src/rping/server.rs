//! The rping server (`rping_run_server` / `rping_test_server`): one client, then exit.

use super::conn::{wait_event, Cb, Debug, Got};
use super::proto::c_str;
use super::RpingArgs;
use crate::cmatose::resolve_host;
use softrdma_cm::{CmId, CmOption, EventChannel, EventType, PortSpace};
use softrdma_verbs::WcOpcode;

/// Backlog of the listener, as rping.
const BACKLOG: i32 = 3;

/// Binds, listens, serves one client, and returns when it disconnects.
pub fn run(args: &RpingArgs) -> Result<(), String> {
    let debug = Debug(args.debug);
    let cm = EventChannel::new().map_err(|e| format!("rdma_create_event_channel: {e}"))?;
    let listen_id = CmId::create(Some(&cm), PortSpace::Tcp).map_err(|e| format!("rdma_create_id: {e}"))?;
    debug.log("created cm_id");
    let result = serve(args, &cm, &listen_id, debug);
    let destroyed = listen_id.destroy().map_err(|e| format!("rdma_destroy_id: {e}"));
    result.and(destroyed)
}

fn serve(args: &RpingArgs, cm: &EventChannel, listen_id: &CmId, debug: Debug) -> Result<(), String> {
    let bind = resolve_host(args.addr.as_deref().unwrap_or("0.0.0.0"), args.port).map_err(|f| f.reason)?;
    // A rerun on the same port must not wait for the last run's TIME_WAIT (see cmatose).
    listen_id
        .set_option(CmOption::ReuseAddr(true))
        .map_err(|e| format!("rdma_set_option REUSEADDR: {e}"))?;
    listen_id.bind_addr(bind).map_err(|e| format!("rdma_bind_addr: {e}"))?;
    debug.log("rdma_bind_addr successful");
    listen_id.listen(BACKLOG).map_err(|e| format!("rdma_listen: {e}"))?;
    let local = listen_id.local_addr().unwrap_or(bind);
    if args.verbose || args.debug {
        println!(
            "rping: listening on {local}; remote peers can connect to: {}",
            crate::cmatose::remote_addresses(local)
        );
    }
    let child = wait_event(cm, EventType::ConnectRequest, None, "server", debug)?;
    debug.log(format!(
        "child cma from {}",
        child.peer_addr().map(|p| p.to_string()).unwrap_or_default()
    ));
    let mut cb = match Cb::setup(cm.clone(), child.clone(), args.size, "server", debug) {
        Ok(cb) => cb,
        Err(e) => {
            let _ = child.reject(&[]);
            let _ = child.destroy();
            return Err(format!("setup_qp failed: {e}"));
        }
    };
    let result = accept_and_serve(&mut cb, args);
    let ended = match &result {
        Ok(()) => Ok(()),
        Err(_) => cb.disconnect(true),
    };
    let destroyed = cb.destroy();
    result.and(ended).and(destroyed)
}

fn accept_and_serve(cb: &mut Cb, args: &RpingArgs) -> Result<(), String> {
    cb.post_recv()?;
    cb.debug.log("accepting client connection request");
    cb.id.accept(None).map_err(|e| format!("rdma_accept: {e}"))?;
    wait_event(
        &cb.cm,
        EventType::Established,
        Some(super::STEP_TIMEOUT),
        "server",
        cb.debug,
    )?;
    test_server(cb, args)
}

/// The ping loop; ends cleanly when the client disconnects between pings.
fn test_server(cb: &mut Cb, args: &RpingArgs) -> Result<(), String> {
    let mut ping = 0u64;
    loop {
        // Wait for the client's start buffer.
        let wc = match cb.wait(WcOpcode::Recv)? {
            Got::Wc(wc) => wc,
            Got::Disconnected => {
                cb.debug.log(format!("client disconnected after {ping} pings"));
                return Ok(());
            }
        };
        let start = cb.take_info(&wc)?;
        cb.debug.log(format!(
            "Received rkey {:x} addr {:x} len {} from peer",
            start.rkey, start.buf, start.size
        ));
        if start.size > args.size {
            return Err(format!(
                "the client's buffer of {} bytes exceeds this server's ping size {} (-S)",
                start.size, args.size
            ));
        }
        cb.rdma(false, start.size, start)?;
        cb.debug.log("server posted rdma read req");
        expect(cb, WcOpcode::RdmaRead, ping)?;
        cb.debug.log("server received read complete");
        let data = cb.rdma_mr.to_vec();
        if args.verbose {
            println!("server ping data: {}", c_str(&data[..start.size as usize]));
        }
        cb.send()?;
        cb.debug.log("server posted go ahead");
        // Wait for the client's sink buffer.
        let wc = match cb.wait(WcOpcode::Recv)? {
            Got::Wc(wc) => wc,
            Got::Disconnected => return Err(format!("the client disconnected in the middle of ping {ping}")),
        };
        let sink = cb.take_info(&wc)?;
        cb.debug.log("server received sink adv");
        let text = data.iter().position(|&b| b == 0).map(|n| n + 1).unwrap_or(data.len());
        let len = (text as u32).min(sink.size);
        cb.debug.log(format!(
            "rdma write from lkey {:x} laddr {:x} len {len}",
            cb.rdma_mr.lkey(),
            cb.rdma_mr.addr()
        ));
        cb.rdma(true, len, sink)?;
        expect(cb, WcOpcode::RdmaWrite, ping)?;
        cb.debug.log("server rdma write complete");
        cb.send()?;
        cb.debug.log("server posted go ahead");
        ping += 1;
    }
}

/// Waits for a completion that must come before the client may leave.
fn expect(cb: &mut Cb, want: WcOpcode, ping: u64) -> Result<(), String> {
    match cb.wait(want)? {
        Got::Wc(_) => Ok(()),
        Got::Disconnected => Err(format!("the client disconnected in the middle of ping {ping}")),
    }
}
