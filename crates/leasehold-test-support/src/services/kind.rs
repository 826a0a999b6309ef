//! The services `scripts/services up` provides, and where each one's address is configured.

use std::fmt;

/// One of the services that `scripts/services up` provides.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Service {
    /// A single Redis server (`LEASEHOLD_TEST_REDIS_URL`, one `redis://` URL).
    Redis,
    /// Five independent Redis servers for Redlock
    /// (`LEASEHOLD_TEST_REDLOCK_URLS`, comma-separated `redis://` URLs).
    Redlock,
    /// A three-master Redis Cluster (`LEASEHOLD_TEST_REDIS_CLUSTER_URLS`, comma-separated
    /// `redis://` URLs of its nodes).
    RedisCluster,
    /// PostgreSQL over TCP (`LEASEHOLD_TEST_POSTGRES_URL`, one `postgres://` URL).
    Postgres,
    /// PostgreSQL over its unix socket (`LEASEHOLD_TEST_POSTGRES_SOCKET`, the
    /// socket directory). [`Endpoints::url`](super::Endpoints::url) gives a libpq key=value
    /// connection string (`host=<dir> port=… user=… password=… dbname=…`)
    /// that `tokio_postgres::connect` accepts; user, password, database and
    /// port are taken from `LEASEHOLD_TEST_POSTGRES_URL` when it is set.
    PostgresSocket,
    /// A single etcd member (`LEASEHOLD_TEST_ETCD_ENDPOINTS`, comma-separated
    /// `host:port` client endpoints).
    Etcd,
    /// A three-member etcd cluster (`LEASEHOLD_TEST_ETCD_CLUSTER_ENDPOINTS`,
    /// comma-separated `host:port` client endpoints).
    EtcdCluster,
    /// pgbouncer in `pool_mode = transaction` in front of the PostgreSQL
    /// database (`LEASEHOLD_TEST_PGBOUNCER_URL`, one `postgres://` URL; same
    /// user and password, SCRAM authentication, no TLS).
    PgBouncer,
    /// A Redis server that speaks TLS only, without client certificates or
    /// auth (`LEASEHOLD_TEST_REDIS_TLS_URL`, one `rediss://` URL); its
    /// certificate chains to [`tls_ca`](super::tls_ca).
    RedisTls,
    /// A single etcd member serving clients over TLS (https, certificate
    /// chains to [`tls_ca`](super::tls_ca)) with auth enabled
    /// (`LEASEHOLD_TEST_ETCD_SECURE_ENDPOINTS`, `host:port`; credentials in
    /// [`ETCD_USER_VAR`](super::ETCD_USER_VAR) / [`ETCD_PASSWORD_VAR`](super::ETCD_PASSWORD_VAR)).
    EtcdSecure,
    /// The Redis Cluster of [`RedisCluster`](Service::RedisCluster) reached over TLS: each of
    /// its nodes also listens for TLS clients, without client certificates or auth
    /// (`LEASEHOLD_TEST_REDIS_CLUSTER_TLS_URLS`, comma-separated `rediss://` URLs; the
    /// certificate chains to [`tls_ca`](super::tls_ca)). A TLS client is told the nodes' TLS
    /// ports by `CLUSTER SLOTS` and in redirections.
    RedisClusterTls,
    /// Three Redis Sentinels watching a master and its two replicas as service `leasehold`
    /// (`LEASEHOLD_TEST_REDIS_SENTINELS`, comma-separated `host:port` of the sentinels; the
    /// `redis+sentinel://` URL of the service is in `LEASEHOLD_TEST_REDIS_SENTINEL_URL`).
    RedisSentinel,
}

impl Service {
    /// Every service, in a fixed order.
    pub const ALL: [Service; 12] = [
        Service::Redis,
        Service::Redlock,
        Service::RedisCluster,
        Service::Postgres,
        Service::PostgresSocket,
        Service::Etcd,
        Service::EtcdCluster,
        Service::PgBouncer,
        Service::RedisTls,
        Service::EtcdSecure,
        Service::RedisClusterTls,
        Service::RedisSentinel,
    ];

    /// The variable (in the env file or the process environment) that holds
    /// this service's address(es).
    pub fn env_key(self) -> &'static str {
        match self {
            Service::Redis => "LEASEHOLD_TEST_REDIS_URL",
            Service::Redlock => "LEASEHOLD_TEST_REDLOCK_URLS",
            Service::RedisCluster => "LEASEHOLD_TEST_REDIS_CLUSTER_URLS",
            Service::Postgres => "LEASEHOLD_TEST_POSTGRES_URL",
            Service::PostgresSocket => "LEASEHOLD_TEST_POSTGRES_SOCKET",
            Service::Etcd => "LEASEHOLD_TEST_ETCD_ENDPOINTS",
            Service::EtcdCluster => "LEASEHOLD_TEST_ETCD_CLUSTER_ENDPOINTS",
            Service::PgBouncer => "LEASEHOLD_TEST_PGBOUNCER_URL",
            Service::RedisTls => "LEASEHOLD_TEST_REDIS_TLS_URL",
            Service::EtcdSecure => "LEASEHOLD_TEST_ETCD_SECURE_ENDPOINTS",
            Service::RedisClusterTls => "LEASEHOLD_TEST_REDIS_CLUSTER_TLS_URLS",
            Service::RedisSentinel => "LEASEHOLD_TEST_REDIS_SENTINELS",
        }
    }

    /// A short human-readable name, as used in skip and failure messages.
    pub fn name(self) -> &'static str {
        match self {
            Service::Redis => "redis",
            Service::Redlock => "redlock",
            Service::RedisCluster => "redis-cluster",
            Service::Postgres => "postgres",
            Service::PostgresSocket => "postgres-socket",
            Service::Etcd => "etcd",
            Service::EtcdCluster => "etcd-cluster",
            Service::PgBouncer => "pgbouncer",
            Service::RedisTls => "redis-tls",
            Service::EtcdSecure => "etcd-secure",
            Service::RedisClusterTls => "redis-cluster-tls",
            Service::RedisSentinel => "redis-sentinel",
        }
    }

    pub(super) fn default_port(self) -> u16 {
        match self {
            Service::Redis
            | Service::Redlock
            | Service::RedisCluster
            | Service::RedisTls
            | Service::RedisClusterTls => 6379,
            Service::Postgres | Service::PostgresSocket => 5432,
            Service::PgBouncer => 6432,
            Service::Etcd | Service::EtcdCluster | Service::EtcdSecure => 2379,
            Service::RedisSentinel => 26379,
        }
    }
}

impl fmt::Display for Service {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
