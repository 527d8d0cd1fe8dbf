//! The passive side of `softrdma cmatose` (ucmatose's `run_server`).

use super::node::Node;
use super::{event_failure, next_event, resolve_host, CmatoseArgs, Failure, Messages, STALL_TIMEOUT};
use softrdma_cm::{addr, CmEvent, CmId, CmOption, EventChannel, EventType, PortSpace};
use std::net::SocketAddr;
use std::time::Instant;

/// The server's state: the listener, one node per accepted request, and the countdowns.
struct Server {
    channel: EventChannel,
    connections: usize,
    msgs: Messages,
    nodes: Vec<Node>,
    connects_left: usize,
    /// In the data or disconnect phase (a DISCONNECTED is expected, late requests are refused).
    connected_phase: bool,
}

/// Runs the server: listen, accept `-c` connections, exchange messages, disconnect.
pub fn run(args: &CmatoseArgs, msgs: Messages) -> Result<(), Failure> {
    println!("cmatose: starting server");
    let channel = EventChannel::new().map_err(|e| Failure::verbs("rdma_create_event_channel", &e))?;
    let listen_id =
        CmId::create(Some(&channel), PortSpace::Tcp).map_err(|e| Failure::verbs("listen request failed", &e))?;
    let mut server = Server {
        channel,
        connections: args.connections as usize,
        msgs,
        nodes: Vec::new(),
        connects_left: args.connections as usize,
        connected_phase: false,
    };
    let result = server.serve(args, &listen_id);
    let cleanup = server.destroy_nodes();
    let listener = listen_id
        .destroy()
        .map_err(|e| Failure::verbs("rdma_destroy_id (listener)", &e));
    result.and(cleanup).and(listener)
}

impl Server {
    fn serve(&mut self, args: &CmatoseArgs, listen_id: &CmId) -> Result<(), Failure> {
        let bind = resolve_host(args.bind.as_deref().unwrap_or("0.0.0.0"), args.port)?;
        // The CM port is a TCP port here: without REUSEADDR a rerun on the same port fails
        // while the last run's connections sit in TIME_WAIT (the kernel's rdma_cm has no such wait).
        listen_id
            .set_option(CmOption::ReuseAddr(true))
            .map_err(|e| Failure::verbs("rdma_set_option REUSEADDR", &e))?;
        listen_id
            .bind_addr(bind)
            .map_err(|e| Failure::verbs("bind address failed", &e))?;
        listen_id
            .listen(0)
            .map_err(|e| Failure::verbs("failure trying to listen", &e))?;
        let local = listen_id.local_addr().unwrap_or(bind);
        println!(
            "cmatose: listening on {local}; remote peers can connect to: {}",
            remote_addresses(local)
        );
        while self.connects_left > 0 {
            let ev = self
                .channel
                .get_event(None)
                .map_err(|e| Failure::verbs("failure in rdma_get_cm_event in connect events", &e))?;
            super::trace_event(&ev);
            self.handle(ev)?;
        }
        self.connected_phase = true;
        if self.msgs.count > 0 {
            println!("initiating data transfers");
            for n in self.nodes.iter().filter(|n| n.connected) {
                n.post_sends(self.msgs)?;
            }
            println!("completing sends");
            for n in self.nodes.iter().filter(|n| n.connected) {
                n.complete_sends(self.msgs, false)?;
            }
            println!("receiving data transfers");
            for n in self.nodes.iter().filter(|n| n.connected) {
                n.complete_recvs(self.msgs)?;
            }
            println!("data transfers complete");
        }
        println!("cmatose: disconnecting");
        for n in self.nodes.iter_mut().filter(|n| n.connected) {
            n.connected = false;
            // A peer that already disconnected leaves the id DISCONNECTED; its event is counted below.
            if let Err(e) = n.id.disconnect() {
                tracing::debug!(error = %e, "rdma_disconnect");
            }
        }
        self.disconnect_events()?;
        println!("disconnected");
        Ok(())
    }

    /// Waits for DISCONNECTED on every established connection.
    fn disconnect_events(&mut self) -> Result<(), Failure> {
        let deadline = Instant::now() + STALL_TIMEOUT;
        while self.disconnects_left() > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            let n = self.disconnects_left();
            let ev = next_event(&self.channel, left, || {
                format!("waiting for DISCONNECTED on {n} connection(s)")
            })?;
            self.handle(ev)?;
        }
        Ok(())
    }

    fn disconnects_left(&self) -> usize {
        self.nodes.iter().filter(|n| n.established && !n.down).count()
    }

    /// `cma_handler`: one event, acknowledged when this returns.
    fn handle(&mut self, ev: CmEvent) -> Result<(), Failure> {
        match ev.event {
            EventType::ConnectRequest => {
                let id = ev.id.clone();
                drop(ev);
                self.connect_handler(id)
            }
            EventType::Established => {
                let node = self.node(&ev.id)?;
                node.connected = true;
                node.established = true;
                self.connects_left = self.connects_left.saturating_sub(1);
                Ok(())
            }
            EventType::Disconnected => {
                let phase = self.connected_phase;
                let node = self.node(&ev.id)?;
                node.connected = false;
                node.down = true;
                if !phase {
                    return Err(event_failure(&node.label(), &ev));
                }
                Ok(())
            }
            EventType::AddrError
            | EventType::RouteError
            | EventType::ConnectError
            | EventType::Unreachable
            | EventType::Rejected
            | EventType::DeviceRemoval => {
                let label = self
                    .node(&ev.id)
                    .map(|n| n.label())
                    .unwrap_or_else(|_| "listener".into());
                Err(event_failure(&label, &ev))
            }
            _ => Ok(()),
        }
    }

    fn node(&mut self, id: &CmId) -> Result<&mut Node, Failure> {
        self.nodes
            .iter_mut()
            .find(|n| n.id == *id)
            .ok_or_else(|| Failure::new("CM event for an unknown id"))
    }

    /// `connect_handler`: a QP and posted receives for the request, then accept; requests
    /// beyond `-c` are rejected.
    fn connect_handler(&mut self, id: CmId) -> Result<(), Failure> {
        let peer = id.peer_addr().map(|p| p.to_string()).unwrap_or_default();
        if self.nodes.len() == self.connections || self.connected_phase {
            println!("cmatose: failing connection request from {peer} (all -c connections are taken)");
            let _ = id.reject(b"cmatose: all connections of the test are taken");
            let _ = id.destroy();
            return Ok(());
        }
        let mut node = Node::new(self.nodes.len(), id);
        if let Err(f) = node.init(self.msgs) {
            println!("cmatose: failing connection request");
            let _ = node.id.reject(&[]);
            return Err(f);
        }
        if let Err(e) = node.id.accept(None) {
            println!("cmatose: failing connection request");
            let _ = node.id.reject(&[]);
            return Err(Failure::verbs(&format!("{}: failure accepting", node.label()), &e));
        }
        self.nodes.push(node);
        Ok(())
    }

    fn destroy_nodes(&mut self) -> Result<(), Failure> {
        let mut result = Ok(());
        for node in self.nodes.drain(..) {
            let r = node.destroy();
            if result.is_ok() {
                result = r;
            }
        }
        result
    }
}

/// The addresses a remote peer can use for a listener bound to `local` (never loopback).
pub(crate) fn remote_addresses(local: SocketAddr) -> String {
    let ip = local.ip();
    if addr::is_loopback(ip) {
        return "none (bound to a loopback address: only this host can connect)".into();
    }
    let all = match softrdma_cm::advertised_addresses(local.port()) {
        Ok(a) => a,
        Err(e) => return format!("unknown ({e})"),
    };
    let usable: Vec<String> = all
        .iter()
        .filter(|a| {
            if addr::is_wildcard(ip) {
                // 0.0.0.0 takes IPv4 only; :: takes both (unless AFONLY).
                ip.is_ipv6() || a.is_ipv4()
            } else {
                addr::canonical(a.ip()) == addr::canonical(ip)
            }
        })
        .map(|a| a.to_string())
        .collect();
    if usable.is_empty() {
        "none (no RDMA device with an active port has a non-loopback address here)".into()
    } else {
        usable.join(", ")
    }
}
