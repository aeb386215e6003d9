//! The engine's errors into [`GatewayError`]: `GatewayError` lives in beige-client, which
//! knows none of these types, so its engine variants hold them as a
//! [`BoxError`](super::BoxError) and the conversions (what `?` uses) are here.

use super::GatewayError;
use crate::audit::AuditError;
use crate::config::ConfigError;
use crate::disk::DiskLow;
use crate::plugin::PluginError;
use crate::sandbox::SandboxError;
use crate::skills::SkillError;
use crate::store::StoreError;

macro_rules! engine_errors {
    ($($error:ty => $variant:ident),* $(,)?) => {$(
        impl From<$error> for GatewayError {
            fn from(e: $error) -> Self {
                GatewayError::$variant { source: Box::new(e) }
            }
        }
    )*};
}

engine_errors! {
    SandboxError => Sandbox,
    ConfigError => Config,
    PluginError => Plugin,
    AuditError => Audit,
    crate::audit::chain::ChainError => Audit,
    SkillError => Skill,
    StoreError => Store,
    DiskLow => DiskLow,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_engine_error_keeps_its_text_and_its_type() {
        let e = GatewayError::from(SandboxError::UnknownAgent { agent: "a".into() });
        assert_eq!(e.to_string(), "no sandbox is configured for agent 'a'");
        let GatewayError::Sandbox { source } = &e else {
            panic!("not a sandbox error: {e:?}");
        };
        assert!(matches!(
            source.downcast_ref::<SandboxError>(),
            Some(SandboxError::UnknownAgent { agent }) if agent == "a"
        ));
    }
}
