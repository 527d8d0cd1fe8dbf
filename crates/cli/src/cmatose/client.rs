//! The active side of `softrdma cmatose` (ucmatose's `run_client`).

use super::node::Node;
use super::{event_failure, next_event, resolve_host, CmatoseArgs, Failure, Messages, STALL_TIMEOUT};
use softrdma_cm::{CmEvent, CmId, CmOption, ConnParam, EventChannel, EventType, PortSpace};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// `rdma_resolve_addr` / `rdma_resolve_route` timeout, as ucmatose.
const RESOLVE_TIMEOUT_MS: i32 = 2000;

/// Slack on top of the connect timeout: how long the client waits for the next CM event.
const EVENT_SLACK: Duration = Duration::from_secs(10);

/// The client's state: one node per connection, all ids on one channel.
struct Client {
    channel: EventChannel,
    msgs: Messages,
    nodes: Vec<Node>,
    connects_left: usize,
}

/// Runs the client against `server`.
pub fn run(args: &CmatoseArgs, server: &str, msgs: Messages) -> Result<(), Failure> {
    println!("cmatose: starting client");
    let dst = resolve_host(server, args.port)?;
    let src = args.bind.as_deref().map(|b| resolve_host(b, 0)).transpose()?;
    let channel = EventChannel::new().map_err(|e| Failure::verbs("rdma_create_event_channel", &e))?;
    let mut client = Client {
        channel,
        msgs,
        nodes: Vec::new(),
        connects_left: args.connections as usize,
    };
    let result = client.go(args, src, dst);
    let cleanup = client.destroy_nodes();
    result.and(cleanup)
}

impl Client {
    fn go(&mut self, args: &CmatoseArgs, src: Option<SocketAddr>, dst: SocketAddr) -> Result<(), Failure> {
        for i in 0..args.connections as usize {
            let id =
                CmId::create(Some(&self.channel), PortSpace::Tcp).map_err(|e| Failure::verbs("rdma_create_id", &e))?;
            let node = Node::new(i, id);
            set_options(&node, args)?;
            self.nodes.push(node);
        }
        println!("cmatose: connecting");
        for node in &self.nodes {
            node.id
                .resolve_addr(src, dst, RESOLVE_TIMEOUT_MS)
                .map_err(|e| Failure::verbs(&format!("connection {}: failure getting addr {dst}", node.index), &e))?;
        }
        let limit = self
            .nodes
            .first()
            .map(|n| n.id.options().connect_timeout)
            .unwrap_or_default()
            + EVENT_SLACK;
        let mut deadline = Instant::now() + limit;
        while self.connects_left > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            let n = self.connects_left;
            let ev = next_event(&self.channel, left, || {
                format!("connecting to {dst}: {n} connection(s) still pending")
            })?;
            self.handle(ev, true)?;
            deadline = Instant::now() + limit;
        }
        if self.msgs.count > 0 {
            println!("receiving data transfers");
            for n in self.nodes.iter().filter(|n| n.connected) {
                n.complete_recvs(self.msgs)?;
            }
            println!("sending replies");
            for n in self.nodes.iter().filter(|n| n.connected) {
                n.post_sends(self.msgs)?;
            }
            println!("data transfers complete");
        }
        self.disconnect_events()?;
        // As ucmatose, the replies' completions are not awaited before the server's
        // disconnect (which follows its check of every reply); they must still not fail.
        for n in self.nodes.iter().filter(|n| n.established) {
            let flushed = n.complete_sends(self.msgs, true)?;
            if flushed > 0 {
                tracing::debug!(connection = n.index, flushed, "replies unconfirmed at disconnect");
            }
        }
        Ok(())
    }

    /// Waits for the server's disconnect of every established connection.
    fn disconnect_events(&mut self) -> Result<(), Failure> {
        let deadline = Instant::now() + STALL_TIMEOUT;
        while self.disconnects_left() > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            let n = self.disconnects_left();
            let ev = next_event(&self.channel, left, || {
                format!("waiting for DISCONNECTED on {n} connection(s)")
            })?;
            self.handle(ev, false)?;
        }
        Ok(())
    }

    fn disconnects_left(&self) -> usize {
        self.nodes.iter().filter(|n| n.established && !n.down).count()
    }

    /// `cma_handler` for the client: drives each id through route resolution and connect.
    fn handle(&mut self, ev: CmEvent, connecting: bool) -> Result<(), Failure> {
        let msgs = self.msgs;
        let Some(node) = self.nodes.iter_mut().find(|n| n.id == ev.id) else {
            return Err(Failure::new(format!("{} for an unknown id", ev.event)));
        };
        match ev.event {
            EventType::AddrResolved => node
                .id
                .resolve_route(RESOLVE_TIMEOUT_MS)
                .map_err(|e| Failure::verbs(&format!("{}: resolve route failed", node.label()), &e)),
            EventType::RouteResolved => {
                node.init(msgs)?;
                let param = ConnParam {
                    responder_resources: 1,
                    initiator_depth: 1,
                    retry_count: 5,
                    ..ConnParam::default()
                };
                node.id
                    .connect(&param)
                    .map_err(|e| Failure::verbs(&format!("{}: failure connecting", node.label()), &e))
            }
            EventType::Established => {
                node.connected = true;
                node.established = true;
                self.connects_left = self.connects_left.saturating_sub(1);
                Ok(())
            }
            EventType::Disconnected => {
                node.connected = false;
                node.down = true;
                if connecting {
                    return Err(event_failure(&node.label(), &ev));
                }
                Ok(())
            }
            EventType::AddrError
            | EventType::RouteError
            | EventType::ConnectError
            | EventType::Unreachable
            | EventType::Rejected
            | EventType::DeviceRemoval => Err(event_failure(&node.label(), &ev)),
            _ => Ok(()),
        }
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

/// Applies `--timeout-ms`, `-t` and `-a` to a client id.
fn set_options(node: &Node, args: &CmatoseArgs) -> Result<(), Failure> {
    let mut opts = Vec::new();
    if let Some(ms) = args.timeout_ms {
        opts.push(CmOption::ConnectTimeout(Duration::from_millis(ms)));
    }
    if let Some(t) = args.tos {
        opts.push(CmOption::Tos(t));
    }
    if let Some(a) = args.ack_timeout {
        opts.push(CmOption::AckTimeout(a));
    }
    for o in opts {
        node.id
            .set_option(o)
            .map_err(|e| Failure::verbs(&format!("{}: rdma_set_option {o:?}", node.label()), &e))?;
    }
    Ok(())
}
