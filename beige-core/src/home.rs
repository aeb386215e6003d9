//! The runtime home (`BEIGE_HOME`, default `~/.beige`) and every path inside it, and the
//! [`InstallationId`] that names and labels this installation's containers. Clients
//! need the layout too, so it lives in beige-client (`beige_client::home`); this is its
//! old path.

pub use beige_client::home::{
    normalize, user_home, BeigeHome, HomeError, InstallationId, BEIGE_HOME_ENV,
    INSTALLATION_ID_FILE,
};
