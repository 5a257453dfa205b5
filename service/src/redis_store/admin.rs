//! What the admin API asks of Redis beside checks and settlements: forgetting one key's state
//! (`Store::reset`), a plain `DEL` of the one key (every algorithm's state is one key).

use redis::RedisResult;

use super::{Connection, Core};

impl Core {
    /// Deletes `key`; whether it was there.
    pub(super) async fn delete(&self, key: &str) -> RedisResult<bool> {
        let mut command = redis::cmd("DEL");
        command.arg(key);
        let deleted: i64 = match self.link.connect().await? {
            Connection::Single(mut con) => command.query_async(&mut con).await?,
            Connection::Cluster(mut con) => command.query_async(&mut con).await?,
        };
        Ok(deleted > 0)
    }
}
