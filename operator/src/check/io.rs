//! The check's reads: one LIST of each resource (IPPools, IPAMNodes, IPAMBlocks, Nodes,
//! Pods, in that order: see the [module documentation](super)). No watch, no GET, no
//! write; the operator's role (`deploy/operator/rbac.yaml`) allows every one of them.
//!
//! Pods are listed as the operator's watch lists them, with `resourceVersion=0`: the API
//! server answers from its watch cache, whole, with no continue token to expire. The other
//! lists are consistent, in pages; a continue token the server has compacted away (410)
//! starts that list again once before the check reports the error. The client's read
//! timeout ([`tidepool_api::client`]) fails a list whose server goes silent.

use std::fmt::Debug;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::ListParams;
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use tidepool_api as api;

use super::{Inputs, Report, check};
use crate::error::Error;

/// Objects per page of a LIST.
const PAGE: u32 = 500;

/// How a resource is listed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Read {
    /// A consistent list, in pages.
    Consistent,
    /// `resourceVersion=0`: from the watch cache.
    FromCache,
}

/// Every page of one list.
async fn pages<K>(api: &Api<K>, read: Read) -> Result<Vec<K>, kube::Error>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    let first = ListParams::default().limit(PAGE);
    let mut params = match read {
        Read::Consistent => first.clone(),
        // no limit: kube sends no resourceVersion=0 with one
        Read::FromCache => ListParams::default().match_any(),
    };
    let mut items = Vec::new();
    loop {
        let page = api.list(&params).await?;
        let next = page.metadata.continue_.clone().filter(|c| !c.is_empty());
        items.extend(page.items);
        match next {
            // a continuation names no resourceVersion (as client-go's pager sends it)
            Some(token) => params = first.clone().continue_token(&token),
            None => return Ok(items),
        }
    }
}

/// Lists every object of one resource, handing each to `f`; a 410 (an expired continue
/// token) starts the list again, once.
async fn list_all<K>(
    client: &Client,
    resource: &'static str,
    read: Read,
    f: impl FnMut(K),
) -> Result<(), Error>
where
    K: Resource + Clone + DeserializeOwned + Debug,
    K::DynamicType: Default,
{
    let api: Api<K> = Api::all(client.clone());
    let items = match pages(&api, read).await {
        Err(e) if is_gone(&e) => {
            tracing::info!(resource, error = %e, "a list expired; listing again");
            pages(&api, read).await
        }
        other => other,
    }
    .map_err(|source| Error::List { resource, source })?;
    items.into_iter().for_each(f);
    Ok(())
}

fn is_gone(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 410)
}

/// Reads everything a check needs.
pub async fn gather(client: &Client) -> Result<Inputs, Error> {
    use Read::{Consistent, FromCache};
    let mut inputs = Inputs::new();
    list_all::<api::IPPool>(client, "ippools", Consistent, |p| inputs.add_pool(p)).await?;
    list_all::<api::IPAMNode>(client, "ipamnodes", Consistent, |n| {
        inputs.add_ipam_node(&n)
    })
    .await?;
    list_all::<api::IPAMBlock>(client, "ipamblocks", Consistent, |b| inputs.add_block(&b)).await?;
    list_all::<Node>(client, "nodes", Consistent, |n| inputs.add_node(&n)).await?;
    list_all::<Pod>(client, "pods", FromCache, |p| inputs.add_pod(p)).await?;
    Ok(inputs)
}

/// The check against a server: [`gather`], then [`check`]. What `tidepool-operator check`
/// runs.
pub async fn run(client: &Client) -> Result<Report, Error> {
    let inputs = gather(client).await?;
    Ok(check(&inputs))
}
