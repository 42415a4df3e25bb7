//! Lock markers on Redis: an orphan (its instance died before storing the lockout) gets its
//! lockout stored, and a late change of one lockout's marker leaves another's alone.

use super::*;

/// An instance that dies between setting an account's lock marker and storing the lockout
/// leaves an orphaned marker: the next failure on any instance (5 s or more after the
/// marker was set) stores the lockout under the marker's id, so an analyst sees it and can
/// release it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(production_tests),
    ignore = "set PALISADE_TEST_DATABASE_URL and PALISADE_TEST_REDIS_URL"
)]
async fn an_orphaned_lock_marker_gets_its_lockout_stored() {
    let Some(app) = TestApp::spawn(Backend::Production).await else {
        return;
    };
    let account = palisade::model::SubjectKey::user("orphaned", 64).unwrap();
    let key = app.app.stores.keys.lock(&account);
    // Made a minute ago: a younger unstored marker is still being stored by its instance.
    let id = ulid::Ulid::from_datetime(std::time::SystemTime::now() - Duration::from_secs(60))
        .to_string();
    let redis = redis::Client::open(app.settings.redis_url.clone().unwrap()).unwrap();
    let mut conn = redis.get_multiplexed_async_connection().await.unwrap();
    let _: () = redis::cmd("SET")
        .arg(&key)
        .arg(&id)
        .arg("PX")
        .arg(900_000)
        .query_async(&mut conn)
        .await
        .unwrap();
    let answer = app.fail("orphan", "orphaned", &["203.0.113.90"], 11).await;
    assert_eq!(answer["decisions"][0]["action"], "lockout", "{answer}");
    let items = app.lockouts("?account=orphaned").await;
    assert_eq!(items.len(), 1, "{items:?}");
    assert_eq!(items[0]["id"], id.as_str());
    // Stored once; the marker now says so (no durable lookup for later failures).
    app.fail("orphan-more", "orphaned", &["203.0.113.90"], 3)
        .await;
    assert_eq!(app.lockouts("?account=orphaned").await.len(), 1);
    let marker: String = redis::cmd("GET")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(marker, format!("{id}!"));
}

/// A lockout's late "stored" mark or its undo never touches a marker that another lockout set
/// after a release: the marker names its own lockout until that one is released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(production_tests),
    ignore = "set PALISADE_TEST_DATABASE_URL and PALISADE_TEST_REDIS_URL"
)]
async fn a_late_marker_change_leaves_another_lockouts_marker_alone() {
    use palisade::lockout::velocity;
    let Some(app) = TestApp::spawn(Backend::Production).await else {
        return;
    };
    let stores = &app.app.stores;
    let account = palisade::model::SubjectKey::user("remarked", 64).unwrap();
    let now = app.app.clock.now_ms();
    let marker = || velocity::lock_marker(&stores.hot, &stores.keys, &account, now);
    assert!(
        velocity::lock_if_absent(&stores.hot, &stores.keys, &account, "second", now, 60_000)
            .await
            .unwrap()
    );
    // The first lockout (released meanwhile) is marked stored, then undone: neither applies.
    velocity::mark_stored(&stores.hot, &stores.keys, &account, "first")
        .await
        .unwrap();
    velocity::unlock(&stores.hot, &stores.keys, &account, "first", now)
        .await
        .unwrap();
    let velocity::Marker {
        lockout_id: id,
        ttl_ms: ttl,
        stored,
    } = marker().await.unwrap().unwrap();
    assert_eq!((id.as_str(), stored), ("second", false));
    assert!(ttl > 0 && ttl <= 60_000, "{ttl}");
    // Its own lockout's changes apply, and the TTL is kept.
    velocity::mark_stored(&stores.hot, &stores.keys, &account, "second")
        .await
        .unwrap();
    let velocity::Marker {
        lockout_id: id,
        ttl_ms: ttl,
        stored,
    } = marker().await.unwrap().unwrap();
    assert_eq!((id.as_str(), stored), ("second", true));
    assert!(ttl > 0 && ttl <= 60_000, "{ttl}");
    velocity::unlock(&stores.hot, &stores.keys, &account, "second", now)
        .await
        .unwrap();
    assert_eq!(marker().await.unwrap(), None);
}
