//! The warm pool (`agents.<a>.sandbox.warmPool`): spare containers of an agent, kept
//! started and ready so that creating the agent's container again (it died, or was gone
//! at a restart) costs a rename instead of a Docker create and start.
//!
//! Owns the spares' names (`<container name>-warm-<8 hex digits>`), filling the pool in
//! the background, and claiming a spare. A spare is created from **exactly** the agent's
//! [`ContainerSpec`] through the same [`engine_body`] — image, mounts (checked again just
//! before its creation, as for the agent's own container), user, capabilities,
//! `security_opt`, limits, labels and spec hash — only its name differs. Nothing is
//! bound or widened at claim time: the spare is renamed to the agent's container name
//! and its PID 1, which dialled the agent's control socket when it started and was
//! verified as that spare's PID 1 and held by the [`LinkHub`](super::LinkHub) without a
//! hello, is greeted. A spare whose spec hash is not the agent's current one is removed,
//! never claimed. No agent process runs in a spare before it is claimed (PID 1 starts
//! one only for an operation, and none reaches a spare).

use std::collections::HashMap;
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use bollard::query_parameters::{CreateContainerOptions, StartContainerOptions};

use super::{docker_err, engine_body, ContainerSpec, DockerSandbox, LinkMode};
use crate::sandbox::spec::LABEL_INSTALLATION;
use crate::sandbox::SandboxError;

/// How long [`Pool::reset`] waits for a filler to finish its current spare.
const FILLER_STOP: Duration = Duration::from_secs(30);

/// The spares of every agent and the tasks filling them.
#[derive(Debug, Default)]
pub(super) struct Pool {
    /// Spares per agent, in creation order, each as soon as it is being created (so
    /// that its PID 1 is recognised whenever it dials).
    spares: std::sync::Mutex<HashMap<String, Vec<String>>>,
    /// How many spares each agent keeps (`sandbox.warmPool`).
    sizes: std::sync::Mutex<HashMap<String, usize>>,
    /// The filling task of each agent.
    fillers: std::sync::Mutex<HashMap<String, tokio::task::JoinHandle<()>>>,
}

impl Pool {
    fn spares(&self) -> std::sync::MutexGuard<'_, HashMap<String, Vec<String>>> {
        self.spares.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The spares of `agent`.
    pub(super) fn names(&self, agent: &str) -> Vec<String> {
        self.spares().get(agent).cloned().unwrap_or_default()
    }

    pub(super) fn add(&self, agent: &str, name: &str) {
        self.spares()
            .entry(agent.to_string())
            .or_default()
            .push(name.to_string());
    }

    pub(super) fn forget(&self, agent: &str, name: &str) {
        if let Some(names) = self.spares().get_mut(agent) {
            names.retain(|n| n != name);
        }
    }

    /// How many spares `agent` keeps.
    pub(super) fn size(&self, agent: &str) -> usize {
        self.sizes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(agent)
            .copied()
            .unwrap_or(0)
    }

    /// Sets every agent's pool size and forgets every spare (the caller lists the
    /// containers again), after the fillers have finished the spare they were creating
    /// (never aborted half-way, which could leave a container the listing misses).
    pub(super) async fn reset(&self, sizes: HashMap<String, usize>) {
        *self.sizes.lock().unwrap_or_else(PoisonError::into_inner) = HashMap::new();
        let fillers: Vec<_> = self
            .fillers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .drain()
            .map(|(_, task)| task)
            .collect();
        for task in fillers {
            let _ = tokio::time::timeout(FILLER_STOP, task).await;
        }
        self.spares().clear();
        *self.sizes.lock().unwrap_or_else(PoisonError::into_inner) = sizes;
    }
}

/// Whether `container` is named as a spare of the agent container `name`.
pub(super) fn is_spare_of(container: &str, name: &str) -> bool {
    container
        .strip_prefix(name)
        .and_then(|rest| rest.strip_prefix("-warm-"))
        .is_some_and(|suffix| suffix.len() == 8 && suffix.bytes().all(|b| b.is_ascii_hexdigit()))
}

fn spare_name(name: &str) -> String {
    format!("{name}-warm-{:08x}", rand::random::<u32>())
}

impl DockerSandbox {
    /// Spares the agent has now. Over the Unix link, only those whose PID 1 dialled in
    /// and is held by the hub (ready to be greeted); otherwise every spare created.
    pub async fn warm_spares(&self, agent: &str) -> usize {
        let link = self
            .spec_of(agent)
            .await
            .map(|s| s.link)
            .unwrap_or_default();
        self.pool
            .names(agent)
            .iter()
            .filter(|n| link != LinkMode::Unix || self.links.hub.is_parked(n))
            .count()
    }

    /// Starts filling the agent's pool up to its size in the background (no-op when it
    /// keeps none or a filler runs).
    pub(super) fn fill_pool(&self, spec: &ContainerSpec) {
        if self.pool.size(&spec.agent) == 0 {
            return;
        }
        let mut fillers = self
            .pool
            .fillers
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if fillers
            .get(&spec.agent)
            .is_some_and(|task| !task.is_finished())
        {
            return;
        }
        let this = self.clone();
        let spec = spec.clone();
        let agent = spec.agent.clone();
        let task = tokio::spawn(async move {
            // The size is read again after each spare: a reset sets it to 0 to stop.
            while this.pool.names(&spec.agent).len() < this.pool.size(&spec.agent) {
                if let Err(e) = this.create_spare(&spec).await {
                    tracing::warn!(agent = %spec.agent, error = %e, "could not create a spare sandbox for the warm pool");
                    break;
                }
            }
        });
        fillers.insert(agent, task);
    }

    /// Creates and starts one spare from exactly `spec`.
    async fn create_spare(&self, spec: &ContainerSpec) -> Result<(), SandboxError> {
        spec.recheck_mounts()?;
        let name = spare_name(&spec.name);
        // Known before it starts, so its PID 1 is held, not refused, when it dials.
        self.pool.add(&spec.agent, &name);
        let created = async {
            self.docker
                .create_container(
                    Some(CreateContainerOptions {
                        name: Some(name.clone()),
                        ..Default::default()
                    }),
                    engine_body(spec),
                )
                .await
                .map_err(docker_err(format!("create container {name}")))?;
            self.docker
                .start_container(&name, None::<StartContainerOptions>)
                .await
                .map_err(docker_err(format!("start container {name}")))
        }
        .await;
        if let Err(e) = created {
            self.pool.forget(&spec.agent, &name);
            let _ = self.remove(&name).await;
            return Err(e);
        }
        tracing::debug!(agent = %spec.agent, container = %name, "spare sandbox started");
        Ok(())
    }

    /// Makes a ready spare the agent's container (no container of that name may exist):
    /// renames it and greets its PID 1. `Ok(false)`: no spare could be claimed.
    pub(super) async fn claim_spare(&self, spec: &ContainerSpec) -> Result<bool, SandboxError> {
        let agent = spec.agent.as_str();
        let hub = &self.links.hub;
        // Spares whose PID 1 is already held first: their link is up at once.
        let mut names = self.pool.names(agent);
        names.sort_by_key(|n| !hub.is_parked(n));
        for name in names {
            self.pool.forget(agent, &name);
            // A held PID 1 was verified as this spare's, running; the pool only holds
            // spares of the agent's current spec (a reconcile admits a kept one only
            // with the same spec hash). No need to ask the engine again.
            if hub.is_parked(&name) && self.take_spare(spec, &name).await? {
                return Ok(true);
            }
            let info = match self
                .docker
                .inspect_container(
                    &name,
                    None::<bollard::query_parameters::InspectContainerOptions>,
                )
                .await
            {
                Ok(info) => info,
                Err(_) => {
                    hub.drop_parked(&name);
                    continue;
                }
            };
            let state = info.state.unwrap_or_default();
            if state.status == Some(bollard::models::ContainerStateStatusEnum::CREATED) {
                // Its filler is about to start it: not ready yet, but not broken.
                self.pool.add(agent, &name);
                continue;
            }
            let labels = info.config.and_then(|c| c.labels).unwrap_or_default();
            let usable = state.running == Some(true)
                && labels.get(LABEL_INSTALLATION).map(String::as_str)
                    == Some(self.installation.as_str())
                && labels.get(super::LABEL_SPEC).map(String::as_str) == Some(spec.spec_label());
            if !usable {
                hub.drop_parked(&name);
                self.remove(&name).await?;
                continue;
            }
            if self.take_spare(spec, &name).await? {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Renames the spare `name` to the agent's container and greets its PID 1.
    /// `Ok(false)`: it is gone (removed or died since).
    async fn take_spare(&self, spec: &ContainerSpec, name: &str) -> Result<bool, SandboxError> {
        let agent = spec.agent.as_str();
        let hub = &self.links.hub;
        let renamed = self
            .docker
            .rename_container(
                name,
                bollard::query_parameters::RenameContainerOptions {
                    name: spec.name.clone(),
                },
            )
            .await;
        match renamed {
            Ok(()) => {}
            Err(e) if super::status_of(&e) == Some(404) => {
                hub.drop_parked(name);
                return Ok(false);
            }
            Err(e) => return Err(docker_err(format!("rename container {name}"))(e)),
        }
        {
            match spec.link {
                LinkMode::Off => {}
                LinkMode::Unix => {
                    self.expect_link(agent);
                    hub.unpark(name);
                }
                LinkMode::Attach => {
                    self.start_attach(spec);
                    self.expect_link(agent);
                }
            }
            tracing::info!(agent, container = %spec.name, spare = %name, "sandbox taken from the warm pool");
            self.fill_pool(spec);
            Ok(true)
        }
    }
}

/// The verifier's side: which spare, if any, has PID 1 `pid`.
pub(super) async fn spare_with_pid(
    docker: &bollard::Docker,
    pool: &Arc<Pool>,
    agent: &str,
    pid: u32,
) -> Option<String> {
    for name in pool.names(agent) {
        let Ok(info) = docker
            .inspect_container(
                &name,
                None::<bollard::query_parameters::InspectContainerOptions>,
            )
            .await
        else {
            continue;
        };
        let state = info.state.unwrap_or_default();
        if state.running == Some(true) && state.pid.and_then(|p| u32::try_from(p).ok()) == Some(pid)
        {
            return Some(name);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spare_names() {
        let name = spare_name("beige-a-0123456789ab");
        assert!(is_spare_of(&name, "beige-a-0123456789ab"), "{name}");
        assert!(!is_spare_of(&name, "beige-a-0123456789"));
        assert!(!is_spare_of("beige-a-0123456789ab", "beige-a-0123456789ab"));
        assert!(!is_spare_of(
            "beige-a-0123456789ab-warm-xyz",
            "beige-a-0123456789ab"
        ));
        assert!(!is_spare_of(
            "beige-a-0123456789ab-warm-0000000g",
            "beige-a-0123456789ab"
        ));
        // Another agent whose name extends this one's is not a spare of it.
        assert!(!is_spare_of("beige-a-b-warm-00000000", "beige-a"));
    }
}
