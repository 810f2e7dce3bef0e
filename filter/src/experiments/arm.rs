//! The filter's side of experiments (`prewarm_core::experiment`): an inspected request's unit
//! — its user, else its tenant, else its connection (Envoy's `connection.id`); with the
//! experiment's `unit: "tenant"`, its tenant only — picks its arm of the table's experiment.
//! The client's own arm header was removed with the headers (`request::on_headers`); the
//! filter sets its own, and the arm's settings choose whether the filter routes the request
//! and with which view of the table (`routing::TableCache::view`).
//! A request with no unit (no user, no tenant, no connection id; no tenant for a tenant
//! experiment) gets no arm and is routed as without an experiment, counted.

use prewarm_core::experiment::{ArmSettings, Experiment, Unit};

use crate::host::{Host, Metric};

/// The arm a request was assigned to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArmChoice {
    /// The arm header's value, `<experiment>/<arm>`.
    pub header: String,
    pub settings: ArmSettings,
}

/// The arm of the request whose trusted `user` and `tenant` are given, counted.
pub fn assign<H: Host + ?Sized>(
    host: &H,
    experiment: &Experiment,
    user: Option<&str>,
    tenant: Option<&str>,
) -> Option<ArmChoice> {
    let connection;
    let named = match experiment.unit {
        Unit::User => user.or(tenant),
        Unit::Tenant => tenant,
    };
    let unit: &[u8] = match named {
        Some(name) => name.as_bytes(),
        None if experiment.unit == Unit::Tenant => {
            host.count(Metric::ArmNoUnit, 1);
            return None;
        }
        None => {
            connection = host.property(&["connection", "id"]);
            match connection.as_deref() {
                Some(id) if !id.is_empty() => id,
                _ => {
                    host.count(Metric::ArmNoUnit, 1);
                    return None;
                }
            }
        }
    };
    let i = experiment.arm_of(unit);
    let arm = experiment.arms.get(i)?;
    host.count(Metric::ArmAssigned, 1);
    Some(ArmChoice {
        header: experiment.header_value(i)?,
        settings: arm.settings,
    })
}
