//! A request's scopes: which buckets a check reads and writes, with their keys, numbers and
//! multipliers (the budgets that apply, per-device buckets behind a shared address, global
//! parts on a cluster, global shares across regions, blocks that override).

use std::sync::Arc;

use super::{Budgets, Defaults, LimitRequest, Limiter, bucket, budgets};
use crate::config::ScopeKind;
use crate::model::SubjectKey;
use crate::store::{Hot, keys};

/// One scope of a request, resolved to keys and numbers.
#[derive(Debug, Clone)]
pub(super) struct Scope {
    pub(super) budget: usize,
    /// What the bucket is keyed by (the budget's scope, or `ip_device` for a device behind a
    /// shared address).
    pub(super) kind: ScopeKind,
    /// For `ip_device`: the device (whose multiplier it reads); otherwise the bucket's subject.
    pub(super) subject: SubjectKey,
    /// The subject as reported, when it is not `subject` (`device:…@ip:…`).
    pub(super) label: Option<Arc<str>>,
    /// The bucket's key in Redis (empty in process).
    pub(super) bucket_key: String,
    /// The bucket's id in process ([`crate::store::MemoryHot::bucket_id`]; 0 with Redis).
    pub(super) bucket_id: u64,
    /// Empty in-process when no multiplier was stored: the default applies.
    pub(super) multiplier_key: String,
    pub(super) params: bucket::Params,
    /// Times the budget's numbers (a shared address's IP-wide ceiling), else 1.
    pub(super) scale: f64,
    /// A budget held across regions: this region's share of it, by which `params` are
    /// scaled (the bucket keeps its debt in tokens when the share moves:
    /// [`bucket::evaluate_shared`]).
    pub(super) share: Option<f64>,
    pub(super) enforced: bool,
    /// Multiplier used when none is published for the subject.
    pub(super) default_multiplier: f64,
    /// Multiplier used whatever is published (a known context of a locked account).
    pub(super) multiplier_override: Option<f64>,
    /// Blocked because the request's network or ASN is, or by the login guard (the
    /// override is then 0).
    pub(super) network_blocked: bool,
    /// Blocked by the service-wide login guard alone.
    pub(super) guarded: bool,
    /// Blocked because the network or ASN is suspected of spraying, alone (a context the
    /// account knows passes freely).
    pub(super) suspected: bool,
}

impl Scope {
    /// The subject as decisions report it (`device:…@ip:…` for an IP-and-device bucket).
    pub(super) fn reported_subject(&self) -> Arc<str> {
        self.label.clone().unwrap_or_else(|| self.subject.shared())
    }
}

impl Limiter {
    /// Whether the request's device is attested, asked only when it matters: a device id on
    /// a class with a per-endpoint IP budget (auth, expensive). A failed lookup counts as not
    /// attested (the strict IP budget stands).
    pub(super) async fn attested(
        &self,
        budgets: &Budgets,
        class: usize,
        request: &LimitRequest,
    ) -> bool {
        let (Some(device), Some(hook)) = (&request.device, self.sockets.attested.as_ref()) else {
            return false;
        };
        let per_endpoint_ip = budgets
            .applicable(
                class,
                budgets::Present {
                    device: true,
                    ..budgets::Present::of(request)
                },
            )
            .any(|i| budgets.budgets[i].scope == ScopeKind::EndpointIp);
        per_endpoint_ip && hook.is_attested(device).await.unwrap_or(false)
    }

    pub(super) fn scopes(
        &self,
        budgets: &Budgets,
        class: usize,
        request: &LimitRequest,
        attested: bool,
    ) -> Vec<Scope> {
        let class_info = &budgets.classes[class];
        let defaults = self
            .sockets
            .defaults
            .as_ref()
            .map_or_else(Defaults::default, |d| d.defaults(&class_info.name, request));
        let enforced_class = !class_info.shadow;
        let mut out = Vec::with_capacity(class_info.budgets.len() + 2);
        // In-process, with no multiplier stored anywhere, there is nothing to look up: the
        // keys are not built (a multiplier stored meanwhile counts from the next check).
        let multipliers_stored = match &self.hot {
            Hot::Memory(memory) => memory.has_multipliers(),
            Hot::Redis(_) => true,
        };
        let scope = |index: usize, kind, subject: SubjectKey, default_multiplier: f64| {
            let budget = &budgets.budgets[index];
            let (bucket_key, bucket_id) = self.bucket(&subject, &budget.name, None);
            // A budget held across regions: this region spends its leased share (scaling
            // capacity and rate alike keeps the bucket's window).
            let share = self.shares.as_ref().and_then(|shares| {
                let global = shares.global(&budget.name)?;
                let fails_closed = class_info.fail == crate::config::FailMode::Closed;
                Some(shares.share(
                    global,
                    subject.as_str(),
                    request.cost,
                    budget.refill_per_s(),
                    fails_closed,
                ))
            });
            let scaled = share.unwrap_or(1.0);
            Scope {
                budget: index,
                kind,
                bucket_key,
                bucket_id,
                multiplier_key: if multipliers_stored {
                    self.keys.multiplier(&subject, &class_info.name)
                } else {
                    String::new()
                },
                subject,
                label: None,
                params: bucket::Params {
                    capacity: f64::from(budget.capacity()) * scaled,
                    refill_per_s: budget.refill_per_s() * scaled,
                    multiplier: 1.0,
                },
                scale: 1.0,
                share,
                enforced: !budget.shadow && enforced_class,
                default_multiplier: sanitized(default_multiplier),
                multiplier_override: None,
                network_blocked: false,
                guarded: false,
                suspected: false,
            }
        };
        // The client's key is formatted once, for however many IP scopes need it.
        let ip_key = std::cell::OnceCell::new();
        let ip_key = || ip_key.get_or_init(|| SubjectKey::ip(&request.ip)).clone();
        let applicable = budgets.applicable(class, budgets::Present::of(request));
        for index in applicable {
            let budget = &budgets.budgets[index];
            match budget.scope {
                ScopeKind::Global => {
                    let mut global = scope(index, budget.scope, SubjectKey::global(), 1.0);
                    self.global_part(&mut global, &ip_key(), &budget.name, &class_info.name);
                    out.push(global);
                }
                ScopeKind::Ip | ScopeKind::EndpointIp => {
                    let ip = ip_key();
                    match &request.device {
                        Some(device) if defaults.shared_ip || attested => {
                            // Per device behind the address, with the budget's own numbers,
                            // and one IP-wide bucket raised to the ceiling (a shared address,
                            // or an attested device: it does not share the IP's budget).
                            out.push(self.ip_device(
                                budgets,
                                scope(
                                    index,
                                    ScopeKind::IpDevice,
                                    device.clone(),
                                    defaults.ip.min(defaults.device),
                                ),
                                &ip,
                            ));
                            let ceiling = self.shared_ceiling;
                            let mut shared = scope(index, budget.scope, ip, defaults.ip);
                            (shared.bucket_key, shared.bucket_id) =
                                self.bucket(&shared.subject, &budget.name, Some("shared"));
                            shared.params.capacity *= ceiling;
                            shared.params.refill_per_s *= ceiling;
                            shared.scale = ceiling;
                            out.push(shared);
                        }
                        _ => out.push(scope(index, budget.scope, ip, defaults.ip)),
                    }
                }
                ScopeKind::User | ScopeKind::EndpointUser => {
                    if let Some(user) = &request.user {
                        out.push(scope(index, budget.scope, user.clone(), defaults.user));
                    }
                }
                ScopeKind::Device => {
                    if let Some(device) = &request.device {
                        out.push(scope(index, budget.scope, device.clone(), defaults.device));
                    }
                }
                ScopeKind::Tenant => {
                    if let Some(tenant) = &request.tenant {
                        out.push(scope(index, budget.scope, tenant.clone(), 1.0));
                    }
                }
                ScopeKind::Recipient => {
                    if let Some(recipient) = &request.recipient {
                        out.push(scope(index, budget.scope, recipient.key.clone(), 1.0));
                    }
                }
                ScopeKind::Destination => {
                    if let Some(recipient) = &request.recipient
                        && let Some(destination) = &recipient.destination
                    {
                        // A premium-rate number's destination gets a fraction of the budget.
                        out.push(scope(
                            index,
                            budget.scope,
                            destination.clone(),
                            recipient.destination_factor,
                        ));
                    }
                }
                ScopeKind::IpDevice => {
                    if let Some(device) = &request.device {
                        let ip = ip_key();
                        out.push(self.ip_device(
                            budgets,
                            scope(
                                index,
                                budget.scope,
                                device.clone(),
                                defaults.ip.min(defaults.device),
                            ),
                            &ip,
                        ));
                    }
                }
            }
        }
        if defaults.ip_blocked || defaults.login_guard || defaults.login_suspect {
            for scope in out.iter_mut().filter(|s| {
                matches!(
                    s.kind,
                    ScopeKind::Ip | ScopeKind::EndpointIp | ScopeKind::IpDevice
                )
            }) {
                scope.multiplier_override = Some(0.0);
                scope.network_blocked = true;
                scope.guarded = !defaults.ip_blocked && defaults.login_guard;
                scope.suspected =
                    !defaults.ip_blocked && !defaults.login_guard && defaults.login_suspect;
            }
        }
        out
    }

    /// The bucket of `subject` under budget (or counter) `name`, or its `variant`
    /// (`name~variant`): its Redis key, or in process its id (no key text built).
    pub(super) fn bucket(
        &self,
        subject: &SubjectKey,
        name: &str,
        variant: Option<&str>,
    ) -> (String, u64) {
        match (&self.hot, variant) {
            (Hot::Memory(memory), _) => (
                String::new(),
                memory.bucket_id(subject.as_str(), name, variant.unwrap_or("")),
            ),
            (Hot::Redis(_), None) => (self.keys.bucket(subject, name), 0),
            (Hot::Redis(_), Some(variant)) => {
                (self.keys.bucket(subject, &format!("{name}~{variant}")), 0)
            }
        }
    }

    /// On a Redis Cluster, a `global` budget is held in [`keys::SHARDS`] parts, one per
    /// shard, each of 1/16 of its capacity and rate: a check spends from the part in its
    /// address's shard, the slot its address's scopes are in, so the global budget is
    /// neither a slot every check calls nor a call of its own. A budget too small to split
    /// (under 16 tokens a part) stays whole. Its limit and remaining are the part's.
    pub(super) fn global_part(
        &self,
        scope: &mut Scope,
        ip: &SubjectKey,
        budget: &str,
        class: &str,
    ) {
        const PARTS: f64 = keys::SHARDS as f64;
        if !self.keys.is_sharded() || scope.params.capacity < 16.0 * PARTS {
            return;
        }
        scope.bucket_key = self.keys.part_key(ip, &scope.subject, ":b:", budget);
        if !scope.multiplier_key.is_empty() {
            scope.multiplier_key = self.keys.part_key(ip, &scope.subject, ":m:", class);
        }
        scope.params.capacity /= PARTS;
        scope.params.refill_per_s /= PARTS;
    }

    /// Makes a device's scope an IP-and-device one: its own bucket per address (in the
    /// device's Redis slot, reading the device's multiplier) named `device:…@ip:…`.
    pub(super) fn ip_device(&self, budgets: &Budgets, mut scope: Scope, ip: &SubjectKey) -> Scope {
        let budget = &budgets.budgets[scope.budget];
        (scope.bucket_key, scope.bucket_id) =
            self.bucket(&scope.subject, &budget.name, Some(ip.as_str()));
        scope.label = Some(format!("{}@{}", scope.subject.as_str(), ip.as_str()).into());
        scope.kind = ScopeKind::IpDevice;
        scope
    }
}

/// A multiplier as the bucket can use it: finite and not negative (NaN blocks).
pub(super) fn sanitized(value: f64) -> f64 {
    if value.is_nan() {
        0.0
    } else {
        value.clamp(0.0, 1e6)
    }
}
