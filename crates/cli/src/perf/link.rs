//! How `softrdma perf` connects a QP to its peer, per transport: soft-iWARP through its MPA
//! exchange (the request and reply travel as private data), soft-RoCE through a
//! perftest-style exchange over TCP ([`roce_link`](super::roce_link)). Both use the perf port.

use super::endpoint::Endpoint;
use super::roce_link::{self, QpInfo};
use softrdma_iwarp::{connect_blocking, ConnEvent, ConnHandle, ConnRequest, ConnectParams, Listener};
use softrdma_verbs::device::{DeviceInfo, TransportKind};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

type Res<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// A connected perf QP's connection.
pub enum Link {
    /// soft-iWARP: the connection, and on the server its events.
    Iwarp {
        conn: ConnHandle,
        events: Option<mpsc::Receiver<ConnEvent>>,
    },
    /// soft-RoCE: the TCP connection of the exchange.
    Roce(TcpStream),
}

/// The client's side: connects `ep`'s QP to the server at `dst` with the request `private`;
/// returns the link and the server's reply.
pub fn connect(
    ep: &Endpoint,
    dev: &DeviceInfo,
    dst: SocketAddr,
    private: Vec<u8>,
    crc: bool,
    timeout: Duration,
) -> Res<(Link, Vec<u8>)> {
    match dev.transport {
        TransportKind::Iwarp => {
            let params = ConnectParams {
                private_data: private,
                crc,
                timeout,
                ..ConnectParams::default()
            };
            let (conn, reply) = connect_blocking(&ep.qp, dst, params)?;
            Ok((Link::Iwarp { conn, events: None }, reply))
        }
        TransportKind::Roce => {
            let (stream, reply) = roce_link::connect(ep, dev, dst, &private, timeout)?;
            Ok((Link::Roce(stream), reply))
        }
    }
}

impl Link {
    /// The client hangs up (the run is over), waiting up to 2 s for the close to finish.
    pub fn hang_up(self) {
        match self {
            Link::Iwarp { conn, .. } => {
                conn.disconnect();
                let deadline = Instant::now() + Duration::from_secs(2);
                while !conn.is_closed() && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
            Link::Roce(stream) => {
                let _ = stream.shutdown(std::net::Shutdown::Both);
            }
        }
    }

    /// The server waits until the client hangs up, at most `limit`.
    pub fn wait_hangup(&mut self, limit: Duration) {
        match self {
            Link::Iwarp { conn, events } => {
                let deadline = Instant::now() + limit;
                let Some(events) = events else { return };
                loop {
                    match events.recv_timeout(Duration::from_millis(200)) {
                        Ok(ConnEvent::Disconnected { .. }) => break,
                        Ok(_) => {}
                        Err(mpsc::RecvTimeoutError::Timeout) if Instant::now() < deadline && !conn.is_closed() => {}
                        Err(_) => break,
                    }
                }
            }
            Link::Roce(stream) => roce_link::wait_hangup(stream, limit),
        }
    }
}

/// The server's listener on the perf port.
pub enum Acceptor {
    Iwarp {
        listener: Listener,
        requests: mpsc::Receiver<ConnRequest>,
    },
    Roce(TcpListener),
}

/// A client's request, not yet accepted.
pub enum Incoming {
    Iwarp(ConnRequest),
    Roce {
        stream: TcpStream,
        private: Vec<u8>,
        peer: QpInfo,
    },
}

impl Acceptor {
    /// Listens on `bind` for clients of a `dev` QP.
    pub fn bind(dev: &DeviceInfo, bind: SocketAddr) -> Res<Acceptor> {
        Ok(match dev.transport {
            TransportKind::Iwarp => {
                let (listener, requests) = Listener::bind_queue(bind, 16)?;
                Acceptor::Iwarp { listener, requests }
            }
            TransportKind::Roce => {
                Acceptor::Roce(TcpListener::bind(bind).map_err(|e| format!("perf server: bind {bind}: {e}"))?)
            }
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> Res<SocketAddr> {
        Ok(match self {
            Acceptor::Iwarp { listener, .. } => listener.local_addr(),
            Acceptor::Roce(l) => l.local_addr()?,
        })
    }

    /// The next client's request. A RoCE client that sends no valid request within
    /// `timeout` is dropped (the server goes on listening).
    pub fn next(&self, timeout: Duration) -> Res<Incoming> {
        match self {
            Acceptor::Iwarp { requests, .. } => Ok(Incoming::Iwarp(
                requests.recv().map_err(|_| "perf server: listener stopped")?,
            )),
            Acceptor::Roce(l) => loop {
                let (mut stream, peer_addr) = l.accept()?;
                stream.set_read_timeout(Some(timeout))?;
                let _ = stream.set_nodelay(true);
                match roce_link::receive(&mut stream) {
                    Ok((private, peer)) => {
                        stream.set_read_timeout(None)?;
                        return Ok(Incoming::Roce { stream, private, peer });
                    }
                    Err(e) => eprintln!("softrdma perf: {peer_addr}: no QP exchange ({e}); ignored"),
                }
            },
        }
    }
}

impl Incoming {
    /// The client's private data (its request).
    pub fn private_data(&self) -> &[u8] {
        match self {
            Incoming::Iwarp(r) => &r.private_data,
            Incoming::Roce { private, .. } => private,
        }
    }

    /// The client's address.
    pub fn peer(&self) -> String {
        match self {
            Incoming::Iwarp(r) => r.peer_addr.to_string(),
            Incoming::Roce { stream, .. } => stream.peer_addr().map(|a| a.to_string()).unwrap_or_default(),
        }
    }

    /// Refuses the request (soft-iWARP: an MPA reject with `why`; soft-RoCE: the connection
    /// closes).
    pub fn reject(self, why: &[u8]) {
        if let Incoming::Iwarp(r) = self {
            let _ = r.reject(why);
        }
    }

    /// Connects `ep`'s QP to the client's, replying with `private`.
    pub fn accept(self, ep: &Endpoint, dev: &DeviceInfo, private: Vec<u8>, crc: bool) -> Res<Link> {
        match self {
            Incoming::Iwarp(req) => {
                let (tx, events) = mpsc::channel();
                let tx = Mutex::new(tx);
                let sink: softrdma_iwarp::EventSink = Arc::new(move |e: ConnEvent| {
                    if let Ok(t) = tx.lock() {
                        let _ = t.send(e);
                    }
                });
                let params = ConnectParams {
                    private_data: private,
                    crc,
                    ..ConnectParams::default()
                };
                let conn = req.accept(&ep.qp, params, sink)?;
                Ok(Link::Iwarp {
                    conn,
                    events: Some(events),
                })
            }
            Incoming::Roce { mut stream, peer, .. } => {
                roce_link::accept(ep, dev, &mut stream, &peer, &private)?;
                Ok(Link::Roce(stream))
            }
        }
    }
}
