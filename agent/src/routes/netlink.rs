//! The I/O part of `--node-routes`: the kernel's routes through rtnetlink (the
//! rust-netlink project's crate: it lists routes with their protocol and adds and deletes
//! them with one, so no `ip` binary is needed in the agent's image).
//!
//! A netlink socket talks to the network namespace it was created in. To manage another
//! namespace than the agent's own (the tests' node namespaces), the connection lives on a
//! thread of its own that enters that namespace first (`setns` changes only the calling
//! thread's namespace) and runs a single-threaded runtime; callers send it requests.

use std::fs::File;
use std::net::IpAddr;
use std::path::Path;

use futures::TryStreamExt;
use netlink_packet_route::AddressFamily;
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteHeader, RouteMessage, RouteProtocol,
};
use rtnetlink::{Handle, RouteMessageBuilder};
use tokio::sync::{mpsc, oneshot};

use super::PROTOCOL;
use super::desired::Route;
use crate::error::{Error, Result};

type Reply<T> = oneshot::Sender<Result<T>>;

enum Request {
    List(Reply<Vec<Route>>),
    Add(Route, Reply<()>),
    Delete(Route, Reply<()>),
}

/// The main routing table of one network namespace, as far as the routes marked with
/// [`PROTOCOL`] go. Cheap to clone; the connection's thread ends with the last clone.
#[derive(Debug, Clone)]
pub struct RouteTable {
    requests: mpsc::UnboundedSender<Request>,
}

impl RouteTable {
    /// Opens a netlink connection in the network namespace at `netns` (a bind-mounted
    /// `/proc/<pid>/ns/net`, e.g. `/run/netns/<name>`), or in the agent's own with `None`.
    pub async fn open(netns: Option<&Path>) -> Result<Self> {
        let ns = netns
            .map(|p| File::open(p).map_err(Error::io("open the network namespace", p)))
            .transpose()?;
        let (requests, rx) = mpsc::unbounded_channel();
        let (ready, opened) = oneshot::channel();
        std::thread::Builder::new()
            .name("node-routes".into())
            .spawn(move || serve(ns, rx, ready))
            .map_err(Error::io("start the netlink thread", "node-routes"))?;
        opened.await.map_err(|_| gone())??;
        Ok(Self { requests })
    }

    /// The routes marked with [`PROTOCOL`] in the main table, both families.
    pub async fn list(&self) -> Result<Vec<Route>> {
        self.ask(Request::List).await
    }

    /// Adds `r` marked with [`PROTOCOL`]; fails if a route to its destination exists
    /// (ours or not: another's route is never replaced).
    pub async fn add(&self, r: Route) -> Result<()> {
        self.ask(|tx| Request::Add(r, tx)).await
    }

    /// Deletes `r`: only a route with [`PROTOCOL`] matches (the kernel compares the
    /// protocol of a delete request when it is set).
    pub async fn delete(&self, r: Route) -> Result<()> {
        self.ask(|tx| Request::Delete(r, tx)).await
    }

    async fn ask<T>(&self, req: impl FnOnce(Reply<T>) -> Request) -> Result<T> {
        let (tx, rx) = oneshot::channel();
        self.requests.send(req(tx)).map_err(|_| gone())?;
        rx.await.map_err(|_| gone())?
    }
}

fn gone() -> Error {
    Error::Task("the netlink thread of --node-routes ended".into())
}

fn netlink(what: String) -> impl FnOnce(rtnetlink::Error) -> Error {
    move |source| Error::Netlink { what, source }
}

/// The connection's thread: enters `ns`, opens the socket, answers requests until every
/// [`RouteTable`] is dropped.
fn serve(ns: Option<File>, mut rx: mpsc::UnboundedReceiver<Request>, ready: Reply<()>) {
    if let Some(ns) = ns
        && let Err(e) = nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET)
    {
        let _ = ready.send(Err(Error::io("setns", "the managed network namespace")(
            e.into(),
        )));
        return;
    }
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            let _ = ready.send(Err(Error::io("start a runtime", "node-routes")(e)));
            return;
        }
    };
    rt.block_on(async move {
        let handle = match rtnetlink::new_connection() {
            Ok((conn, handle, _)) => {
                tokio::spawn(conn);
                handle
            }
            Err(e) => {
                let _ = ready.send(Err(Error::io("open a netlink socket", "NETLINK_ROUTE")(e)));
                return;
            }
        };
        let _ = ready.send(Ok(()));
        while let Some(req) = rx.recv().await {
            match req {
                Request::List(tx) => {
                    let _ = tx.send(list(&handle).await);
                }
                Request::Add(r, tx) => {
                    let _ = tx.send(change(&handle, r, true).await);
                }
                Request::Delete(r, tx) => {
                    let _ = tx.send(change(&handle, r, false).await);
                }
            }
        }
    });
}

/// The route `r` in the main table, marked with [`PROTOCOL`]. A gateway of another family
/// than the destination (which [`super::desired`] never gives) is refused here, not sent.
fn message(r: Route) -> Result<RouteMessage> {
    let dst = r.dst.trunc();
    // the builder would send a gateway of the other family as RTA_VIA
    if dst.addr().is_ipv4() != r.via.is_ipv4() {
        return Err(Error::Config(format!(
            "route {r}: the gateway's family is not the destination's"
        )));
    }
    let mut m = RouteMessageBuilder::<IpAddr>::new()
        .destination_prefix(dst.addr(), dst.prefix_len())
        .and_then(|b| b.gateway(r.via))
        .map_err(|e| Error::Config(format!("route {r}: {e}")))?
        .protocol(RouteProtocol::Other(PROTOCOL))
        .build();
    m.header.table = RouteHeader::RT_TABLE_MAIN;
    Ok(m)
}

/// Adds (`add`) or deletes route `r`.
async fn change(handle: &Handle, r: Route, add: bool) -> Result<()> {
    let m = message(r)?;
    let (what, sent) = if add {
        ("add", handle.route().add(m).execute().await)
    } else {
        ("delete", handle.route().del(m).execute().await)
    };
    sent.map_err(netlink(format!("{what} {r}")))
}

/// Dumps both families' routes and keeps the main table's marked with [`PROTOCOL`].
async fn list(handle: &Handle) -> Result<Vec<Route>> {
    let mut owned = Vec::new();
    for family in [AddressFamily::Inet, AddressFamily::Inet6] {
        let mut query = RouteMessageBuilder::<IpAddr>::new().build();
        query.header.address_family = family;
        let mut dump = handle.route().get(query).execute();
        while let Some(m) = dump
            .try_next()
            .await
            .map_err(netlink("list routes".into()))?
        {
            if u8::from(m.header.protocol) == PROTOCOL
                && table(&m) == u32::from(RouteHeader::RT_TABLE_MAIN)
            {
                owned.extend(route(&m));
            }
        }
    }
    Ok(owned)
}

/// The table a route is in (the attribute carries ids above 255).
fn table(m: &RouteMessage) -> u32 {
    m.attributes
        .iter()
        .find_map(|a| match a {
            RouteAttribute::Table(t) => Some(*t),
            _ => None,
        })
        .unwrap_or(u32::from(m.header.table))
}

/// A listed route as a [`Route`] (`None` for one without a gateway, which the agent never
/// adds).
fn route(m: &RouteMessage) -> Option<Route> {
    let addr = |a: &RouteAddress| match a {
        RouteAddress::Inet(v4) => Some(IpAddr::V4(*v4)),
        RouteAddress::Inet6(v6) => Some(IpAddr::V6(*v6)),
        _ => None,
    };
    let mut dst = None;
    let mut via = None;
    for a in &m.attributes {
        match a {
            RouteAttribute::Destination(d) => dst = addr(d),
            RouteAttribute::Gateway(g) => via = addr(g),
            _ => {}
        }
    }
    let via = via?;
    let dst = dst.unwrap_or(if via.is_ipv4() {
        IpAddr::from([0u8; 4])
    } else {
        IpAddr::from([0u8; 16])
    });
    let dst = ipnet::IpNet::new(dst, m.header.destination_prefix_length).ok()?;
    Some(Route { dst, via })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(dst: &str, via: &str) -> Route {
        Route {
            dst: dst.parse().unwrap(),
            via: via.parse().unwrap(),
        }
    }

    #[test]
    fn a_route_reads_back_as_it_was_sent_marked_in_the_main_table() {
        for want in [
            r("10.77.2.0/28", "192.168.77.2"),
            r("fd77:2::/124", "fd77::2"),
        ] {
            let m = message(want).unwrap();
            assert_eq!(u8::from(m.header.protocol), PROTOCOL);
            assert_eq!(table(&m), 254);
            assert_eq!(route(&m), Some(want));
        }
        // a host part in the destination is cut off (the kernel would refuse it)
        let m = message(r("10.77.2.5/28", "192.168.77.2")).unwrap();
        assert_eq!(route(&m), Some(r("10.77.2.0/28", "192.168.77.2")));
    }

    #[test]
    fn a_gateway_of_another_family_is_refused_before_the_kernel() {
        assert!(matches!(
            message(r("10.77.2.0/28", "fd77::2")),
            Err(Error::Config(_))
        ));
    }
}
