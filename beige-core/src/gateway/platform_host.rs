//! The gateway as the platform tools see it ([`crate::platform::Host`]): the
//! operations `schedule`, `spawn` and `sessions` run through the gateway itself.

use super::Inner;
use crate::config::Config;

#[async_trait::async_trait]
impl crate::platform::Host for Inner {
    fn config(&self) -> &Config {
        &self.config
    }
}
