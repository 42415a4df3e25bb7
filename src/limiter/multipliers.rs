//! Writing a subject's multiplier directly where the limiter reads it, beside scoring's
//! publishes (for tools and tests that set a multiplier by hand).

use std::time::Duration;

use super::Limiter;
use crate::model::SubjectKey;
use crate::store::Hot;

impl Limiter {
    /// Publishes a multiplier for `subject`, for one endpoint class or (None) every class,
    /// read by the next bucket check on every instance. `ttl` None: until replaced.
    ///
    /// Written directly, beside scoring: scoring's publishes write (or delete) only the
    /// classes its factors set, so a key written here for another class stays until its TTL.
    pub async fn publish_multiplier(
        &self,
        subject: &SubjectKey,
        class: Option<&str>,
        value: f64,
        ttl: Option<Duration>,
    ) -> Result<(), crate::store::Error> {
        let value = if value.is_finite() {
            value.max(0.0)
        } else {
            0.0
        };
        let budgets = self.budgets.load_full();
        let classes: Vec<&str> = match class {
            Some(class) => vec![class],
            None => budgets.classes.iter().map(|c| &*c.name).collect(),
        };
        let now_us = self.clock.monotonic_us();
        for class in classes {
            let key = self.keys.multiplier(subject, class);
            match &self.hot {
                Hot::Memory(memory) => {
                    memory.set_multiplier(
                        &key,
                        value,
                        now_us,
                        ttl.map(|t| u64::try_from(t.as_micros()).unwrap_or(u64::MAX)),
                    );
                }
                Hot::Redis(redis) => {
                    let mut cmd = redis::cmd("SET");
                    cmd.arg(&key).arg(value.to_string());
                    if let Some(ttl) = ttl {
                        cmd.arg("PX")
                            .arg(u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1));
                    }
                    redis.query::<()>(&cmd).await?;
                }
            }
        }
        // A raised multiplier must not be hidden by a cached block on this instance.
        self.l1.clear();
        Ok(())
    }

    /// Removes a subject's multiplier for one class or (None) every class: back to 1.
    pub async fn clear_multiplier(
        &self,
        subject: &SubjectKey,
        class: Option<&str>,
    ) -> Result<(), crate::store::Error> {
        let budgets = self.budgets.load_full();
        let classes: Vec<&str> = match class {
            Some(class) => vec![class],
            None => budgets.classes.iter().map(|c| &*c.name).collect(),
        };
        for class in classes {
            let key = self.keys.multiplier(subject, class);
            match &self.hot {
                Hot::Memory(memory) => memory.clear_multiplier(&key),
                Hot::Redis(redis) => redis.query::<()>(redis::cmd("DEL").arg(&key)).await?,
            }
        }
        self.l1.clear();
        Ok(())
    }
}
