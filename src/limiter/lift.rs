//! The lockout-DoS rule at the limiter: which refusals a context the account knows may lift,
//! and how the request's scopes change when it does (a tightened messaging destination
//! included).

use super::{Challenge, LimitRequest, Limiter, RawOutcome, Scope, is_user_scope, sanitized};
use crate::config::ScopeKind;

impl Limiter {
    /// What the lockout-DoS rule makes of a refused request: when only its account's lock
    /// (or deny) refused it and the account knows the context, the user scopes get the
    /// multiplier without the lock; when only its network's block refused it and the
    /// account knows the context, the block is taken off its IP scopes. Either way the
    /// scopes are changed here and the challenge returned. When only a shared address's
    /// ceiling refused it (a carrier NAT's crowd spent it) and the account knows the
    /// device (or it is attested; the shared address itself proves nothing), the ceiling is
    /// left out: other people's traffic never shuts a known login
    /// out (`Some(None)`: re-checked, no challenge). When only its network's block or the
    /// login guard refused it and the account does not know the context, it gets a login
    /// challenge instead (unless `lockout.unknown_context = "refuse"`). None: the refusal
    /// stands.
    pub(super) async fn lift(
        &self,
        class_name: &str,
        request: &LimitRequest,
        scopes: &mut Vec<Scope>,
        outcomes: &[RawOutcome],
    ) -> Option<Option<Challenge>> {
        let exemptions = self.sockets.exemptions.as_ref()?;
        // A destination tightened for its collapsed conversion (SMS pumping) refused a code
        // asked from a device the account knows, or from an attested one (signed in or not:
        // a first sign-up asks for its code before there is an account): the person is not
        // the pump (whose requests spent the destination's budget), so the destination's
        // budget is left out; the recipient's own still counts.
        if let Some(device) = &request.device
            && blocked_only_by_tightened_destination(scopes, outcomes)
        {
            let passes = match (&request.user, self.sockets.attested.as_ref()) {
                (Some(_), _) => exemptions.known_device(request).await,
                (None, Some(attested)) => attested.is_attested(device).await,
                (None, None) => Ok(false),
            };
            match passes {
                Ok(true) => {
                    scopes.retain(|s| s.kind != ScopeKind::Destination);
                    return Some(None);
                }
                Ok(false) => return None,
                Err(err) => {
                    tracing::warn!(error.cause = %err, "known device unknown; the destination's tightening stands");
                    return None;
                }
            }
        }
        if request.user.is_some()
            && request.device.is_some()
            && blocked_only_by_shared_ceiling(scopes, outcomes)
        {
            match exemptions.known_device(request).await {
                Ok(true) => {
                    scopes.retain(|s| !(s.scale > 1.0 && is_ip_scope(s)));
                    return Some(None);
                }
                Ok(false) => return None,
                Err(err) => {
                    tracing::warn!(error.cause = %err, "known context unknown; the shared address's ceiling stands");
                    return None;
                }
            }
        }
        let by_lock_and_network = blocked_by_lock_and_network(scopes, outcomes);
        if blocked_only_by_user_multiplier(scopes, outcomes) || by_lock_and_network {
            match exemptions.exemption(class_name, request).await {
                Ok(Some(exempt)) => {
                    for scope in scopes.iter_mut().filter(|s| is_user_scope(s)) {
                        scope.multiplier_override = Some(sanitized(exempt.multiplier));
                    }
                    // The login guard or a network block refused the same known context:
                    // one rule answers both, as `/status` does.
                    for scope in scopes.iter_mut().filter(|s| s.network_blocked) {
                        scope.multiplier_override = None;
                    }
                    return Some(Some(exempt));
                }
                Ok(None) => {}
                // The lockout stands: without the rule's answer the request is a stranger's.
                Err(err) => {
                    tracing::warn!(error.cause = %err, "lockout exemption unknown; the block stands");
                }
            }
        } else if request.user.is_some() && blocked_only_by_network(scopes, outcomes) {
            let guarded = scopes.iter().any(|s| s.guarded);
            let suspected = scopes.iter().any(|s| s.suspected);
            let challenge = match exemptions.known_context(request).await {
                // A suspected network's own users pass as if nothing were suspected.
                Ok(true) if suspected => {
                    for scope in scopes.iter_mut().filter(|s| s.network_blocked) {
                        scope.multiplier_override = None;
                    }
                    return Some(None);
                }
                Ok(true) => {
                    let message = if guarded {
                        "logins are guarded against credential stuffing, but the account knows this context: ask for a step-up"
                    } else {
                        "the network is blocked, but the account knows this context: ask for a step-up"
                    };
                    Challenge {
                        multiplier: 1.0,
                        reason: crate::model::Reason::new("known_context", message),
                        lockout_id: None,
                        id: None,
                    }
                }
                // A stranger's context, as stuffing looks, and as a first sign-in does: a
                // challenge the person can pass and the attacker cannot.
                Ok(false) => match exemptions.unknown_context(request).await {
                    Ok(Some(id)) => {
                        let (code, message) = if guarded {
                            (
                                "login_guard",
                                "logins are guarded against credential stuffing and the account does not know this context: ask for a step-up, then report challenge_passed",
                            )
                        } else if suspected {
                            (
                                "network_spraying",
                                "accounts fail from this network or ASN as in password spraying and the account does not know this context: ask for a step-up, then report challenge_passed",
                            )
                        } else {
                            (
                                "network_blocked",
                                "the network is blocked for password spraying and the account does not know this context: ask for a step-up, then report challenge_passed",
                            )
                        };
                        Challenge {
                            multiplier: 1.0,
                            reason: crate::model::Reason::new(code, message),
                            lockout_id: None,
                            id: Some(id),
                        }
                    }
                    Ok(None) => return None,
                    Err(err) => {
                        tracing::warn!(error.cause = %err, "a login from an unknown context could not be counted; the block stands");
                        return None;
                    }
                },
                Err(err) => {
                    tracing::warn!(error.cause = %err, "known context unknown; the network's block stands");
                    return None;
                }
            };
            for scope in scopes.iter_mut().filter(|s| s.network_blocked) {
                scope.multiplier_override = None;
            }
            return Some(Some(challenge));
        }
        None
    }

    /// Notes a request naming an account that only its address's or device's own budget
    /// refused (after [`Limiter::lift`]): the accounts a source tries are spraying
    /// evidence, refused or not.
    pub(super) async fn note_budget_refusal(
        &self,
        class_name: &str,
        request: &LimitRequest,
        scopes: &[Scope],
        outcomes: &[RawOutcome],
    ) {
        if let Some(exemptions) = self.sockets.exemptions.as_ref()
            && request.user.is_some()
            && blocked_only_by_source_budget(scopes, outcomes)
            && let Err(err) = exemptions.refused_by_budget(class_name, request).await
        {
            tracing::warn!(error.cause = %err, "a login its source's budget refused could not be counted");
        }
    }
}

/// True when every enforced scope that refused is an address's or a device's own budget
/// (spent, not a multiplier's block, not a shared address's ceiling).
fn blocked_only_by_source_budget(scopes: &[Scope], outcomes: &[RawOutcome]) -> bool {
    refused_only_by(scopes, outcomes, |s, o| {
        matches!(
            s.kind,
            ScopeKind::Ip | ScopeKind::EndpointIp | ScopeKind::Device | ScopeKind::IpDevice
        ) && s.scale <= 1.0
            && o.retry_after_ms.is_some()
    })
}

/// True when the request was refused only by user scopes whose multiplier allows nothing
/// (a lockout, a deny entry): the case the lockout-DoS rule may lift. Any other blocking
/// scope (an IP's budget, a user's spent budget) refuses the request whatever the rule says.
fn blocked_only_by_user_multiplier(scopes: &[Scope], outcomes: &[RawOutcome]) -> bool {
    refused_only_by(scopes, outcomes, is_lock)
}

/// A user scope blocked by its multiplier (a lockout, a deny entry).
fn is_lock(scope: &Scope, outcome: &RawOutcome) -> bool {
    is_user_scope(scope) && outcome.retry_after_ms.is_none()
}

/// True when some enforced scope refused and every one that did passes `blocks`.
fn refused_only_by(
    scopes: &[Scope],
    outcomes: &[RawOutcome],
    blocks: impl Fn(&Scope, &RawOutcome) -> bool,
) -> bool {
    let mut blocking = scopes
        .iter()
        .zip(outcomes)
        .filter(|(s, o)| s.enforced && !o.allowed)
        .peekable();
    blocking.peek().is_some() && blocking.all(|(s, o)| blocks(s, o))
}

/// True when the refusal is an account's lock (a user scope blocked by its multiplier)
/// together with the network's block or the login guard, and nothing else.
fn blocked_by_lock_and_network(scopes: &[Scope], outcomes: &[RawOutcome]) -> bool {
    let refused = |pick: fn(&Scope, &RawOutcome) -> bool| {
        scopes
            .iter()
            .zip(outcomes)
            .any(|(s, o)| s.enforced && !o.allowed && pick(s, o))
    };
    refused(is_lock)
        && refused(|s, _| s.network_blocked)
        && refused_only_by(scopes, outcomes, |s, o| is_lock(s, o) || s.network_blocked)
}

/// True when every enforced scope that refused is a shared address's IP-wide ceiling.
fn blocked_only_by_shared_ceiling(scopes: &[Scope], outcomes: &[RawOutcome]) -> bool {
    refused_only_by(scopes, outcomes, |s, o| {
        s.scale > 1.0 && is_ip_scope(s) && o.multiplier > 0.0
    })
}

/// True when only destination scopes refused the request, each under a published multiplier
/// below its default (a collapsed conversion's tightening).
fn blocked_only_by_tightened_destination(scopes: &[Scope], outcomes: &[RawOutcome]) -> bool {
    refused_only_by(scopes, outcomes, |s, o| {
        s.kind == ScopeKind::Destination && o.multiplier < s.default_multiplier
    })
}

pub(super) fn is_ip_scope(scope: &Scope) -> bool {
    matches!(scope.kind, ScopeKind::Ip | ScopeKind::EndpointIp)
}

/// True when the request was refused only by its network's block (the scopes it forced
/// to 0): the case an account's known context may lift.
fn blocked_only_by_network(scopes: &[Scope], outcomes: &[RawOutcome]) -> bool {
    refused_only_by(scopes, outcomes, |s, _| s.network_blocked)
}
