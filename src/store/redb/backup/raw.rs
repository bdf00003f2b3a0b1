//! Every table of the data file as bytes: read out of a snapshot and
//! written into a new file without decoding a row.
//!
//! [`Raw<T>`] is a redb type that keeps `T`'s stored bytes as they are but
//! answers redb with `T`'s type name, width and order, so a table opened
//! through it is the table `T` names (redb checks the type names) and a
//! row inserted through it is stored exactly as one of `T` would be. A new
//! table in `tables` must be added to [`TABLES`] too: a backup refuses a
//! file with a table it does not know (a test checks a fresh file's
//! tables against the list).

use std::borrow::Cow;
use std::cmp::Ordering;
use std::marker::PhantomData;

use redb::{
    Key, ReadTransaction, ReadableTable, ReadableTableMetadata, TableDefinition, TypeName, Value,
    WriteTransaction,
};

use super::super::tables as t;
use super::format::TableInfo;

/// `T`'s stored bytes, under `T`'s redb type.
pub struct Raw<T>(PhantomData<T>);

impl<T> std::fmt::Debug for Raw<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Raw")
    }
}

impl<T: Value + 'static> Value for Raw<T> {
    type SelfType<'a>
        = &'a [u8]
    where
        Self: 'a;
    type AsBytes<'a>
        = &'a [u8]
    where
        Self: 'a;

    const NICHE: Option<&'static [u8]> = T::NICHE;

    fn fixed_width() -> Option<usize> {
        T::fixed_width()
    }

    fn from_bytes<'a>(data: &'a [u8]) -> &'a [u8]
    where
        Self: 'a,
    {
        data
    }

    fn as_bytes<'a, 'b: 'a>(value: &'a &'b [u8]) -> &'a [u8]
    where
        Self: 'b,
    {
        value
    }

    fn type_name() -> TypeName {
        T::type_name()
    }
}

impl<T: Key + 'static> Key for Raw<T> {
    fn compare(data1: &[u8], data2: &[u8]) -> Ordering {
        T::compare(data1, data2)
    }

    fn separator<'a>(left: &'a [u8], right: &'a [u8]) -> Cow<'a, [u8]> {
        T::separator(left, right)
    }

    fn min_encoded_key() -> Option<Cow<'static, [u8]>> {
        T::min_encoded_key()
    }
}

/// What takes each row read out of a table: its key's bytes and its
/// value's.
pub type EachRow<'a> = dyn FnMut(&[u8], &[u8]) -> std::io::Result<()> + 'a;

/// One table, copied as bytes.
pub trait Copied: Sync {
    /// Its name, key type and value type.
    fn info(&self) -> TableInfo;
    /// Its name.
    fn name(&self) -> &str;
    /// Hands each row of the snapshot `tx`'s table to `each`, in key
    /// order; how many there were.
    fn each_row(&self, tx: &ReadTransaction, each: &mut EachRow<'_>) -> Result<u64, CopyError>;
    /// Inserts `rows` into the table of `tx` (created if absent).
    fn insert(&self, tx: &WriteTransaction, rows: &[(&[u8], &[u8])]) -> Result<(), redb::Error>;
    /// Rows in the table of `tx`.
    fn len(&self, tx: &ReadTransaction) -> Result<u64, redb::Error>;
    /// Whether the row reads as the table's key and value types, and
    /// writes back to the same bytes (redb's readers of a type panic on
    /// bytes that are not one; this catches that panic).
    fn decodes(&self, key: &[u8], value: &[u8]) -> bool;
    /// The order of two keys in the table.
    fn compare(&self, a: &[u8], b: &[u8]) -> Ordering;
}

/// Why a table could not be read out.
#[derive(Debug, thiserror::Error)]
pub enum CopyError {
    #[error(transparent)]
    Redb(#[from] redb::Error),
    /// Writing what was read failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

thread_local! {
    /// Set while [`quietly`] runs on this thread.
    static QUIET: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// `f`, with a panic caught (redb's readers of a type panic on bytes that
/// are not one) and, once [`quiet_panics`] ran, not printed.
pub fn quietly<T>(f: impl FnOnce() -> T + std::panic::UnwindSafe) -> Option<T> {
    QUIET.with(|q| q.set(true));
    let out = std::panic::catch_unwind(f).ok();
    QUIET.with(|q| q.set(false));
    out
}

/// Installs a panic hook that says nothing of the panics [`quietly`]
/// catches (a hostile backup's rows would print one line each) and hands
/// every other panic to the hook there before. For the CLI's `verify`
/// and `restore`; once per process.
pub fn quiet_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let before = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !QUIET.with(std::cell::Cell::get) {
                before(info);
            }
        }));
    });
}

/// A table of the data file, by its typed definition.
struct Def<K: Key + 'static, V: Value + 'static>(TableDefinition<'static, K, V>);

impl<K: Key + Sync + 'static, V: Value + Sync + 'static> Def<K, V> {
    fn raw(&self) -> TableDefinition<'_, Raw<K>, Raw<V>> {
        TableDefinition::new(self.name())
    }
}

impl<K: Key + Sync + 'static, V: Value + Sync + 'static> Copied for Def<K, V> {
    fn info(&self) -> TableInfo {
        TableInfo {
            name: self.name().to_owned(),
            key: K::type_name().name().to_owned(),
            value: V::type_name().name().to_owned(),
        }
    }

    fn name(&self) -> &str {
        redb::TableHandle::name(&self.0)
    }

    fn each_row(&self, tx: &ReadTransaction, each: &mut EachRow<'_>) -> Result<u64, CopyError> {
        let table = match tx.open_table(self.raw()) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(0),
            Err(e) => return Err(redb::Error::from(e).into()),
        };
        let mut n = 0;
        for row in table.iter().map_err(redb::Error::from)? {
            let (k, v) = row.map_err(redb::Error::from)?;
            each(k.value(), v.value())?;
            n += 1;
        }
        Ok(n)
    }

    fn insert(&self, tx: &WriteTransaction, rows: &[(&[u8], &[u8])]) -> Result<(), redb::Error> {
        let mut table = tx.open_table(self.raw())?;
        for (k, v) in rows {
            table.insert(k, v)?;
        }
        Ok(())
    }

    fn decodes(&self, key: &[u8], value: &[u8]) -> bool {
        quietly(|| {
            let k = K::from_bytes(key);
            let v = V::from_bytes(value);
            K::as_bytes(&k).as_ref() == key && V::as_bytes(&v).as_ref() == value
        })
        .unwrap_or(false)
    }

    fn compare(&self, a: &[u8], b: &[u8]) -> Ordering {
        quietly(|| K::compare(a, b)).unwrap_or(Ordering::Equal)
    }

    fn len(&self, tx: &ReadTransaction) -> Result<u64, redb::Error> {
        match tx.open_table(self.raw()) {
            Ok(t) => Ok(t.len()?),
            Err(redb::TableError::TableDoesNotExist(_)) => Ok(0),
            Err(e) => Err(e.into()),
        }
    }
}

/// The seals' table comes first: a backup's key slots follow its rows, so
/// a reader knows which keys to expect and has them before the bodies.
pub const SEALS: usize = 0;

/// Every table of schema 12, in the order a backup holds them.
pub static TABLES: [&dyn Copied; 21] = [
    &Def(t::INBOX_SEALS),
    &Def(t::META),
    &Def(t::CLAIM_ROWS),
    &Def(t::CLAIM_ROW_EXPIRY),
    &Def(t::EVENTS),
    &Def(t::EVENT_EXPIRY),
    &Def(t::HEADS),
    &Def(t::HEAD_EXPIRY),
    &Def(t::INBOX),
    &Def(t::INBOX_BODIES),
    &Def(t::INBOX_DUE),
    &Def(t::INBOX_QUEUE),
    &Def(t::INBOX_STATUS),
    &Def(t::INBOX_EXPIRY),
    &Def(t::INBOX_DEDUPE),
    &Def(t::INBOX_DEDUPE_EXPIRY),
    &Def(t::INBOX_ATTEMPTS),
    &Def(t::INBOX_REPLAY),
    &Def(t::INBOX_JOBS),
    &Def(t::KV_ROWS),
    &Def(t::KV_ROW_EXPIRY),
];

/// The index in [`TABLES`] of the table named `name`.
pub fn index_of(name: &str) -> Option<usize> {
    TABLES.iter().position(|t| t.name() == name)
}

#[cfg(test)]
mod tests {
    use redb::{ReadableDatabase, TableHandle};

    use super::*;

    /// A fresh data file has exactly the tables a backup copies.
    #[test]
    fn a_backup_copies_every_table_a_data_file_has() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("d.redb");
        let db = redb::Database::create(&path).expect("create");
        super::super::super::migrate::init_schema(&db, &path).expect("schema");
        let tx = db.begin_read().expect("read");
        let mut names: Vec<String> = tx
            .list_tables()
            .expect("list")
            .map(|t| t.name().to_owned())
            .collect();
        names.sort();
        let mut copied: Vec<String> = TABLES.iter().map(|t| t.name().to_owned()).collect();
        copied.sort();
        assert_eq!(names, copied);
        assert_eq!(TABLES[SEALS].name(), "inbox_seals");
    }

    /// Rows copied as bytes open as the typed table, row for row.
    #[test]
    fn rows_copied_as_bytes_read_back_typed() {
        let dir = tempfile::tempdir().expect("dir");
        let from = redb::Database::create(dir.path().join("a.redb")).expect("a");
        let to = redb::Database::create(dir.path().join("b.redb")).expect("b");
        let tx = from.begin_write().expect("w");
        {
            let mut q = tx.open_table(t::INBOX_QUEUE).expect("q");
            q.insert(("s", "stream", -5i128, 9u64, "e2"), ())
                .expect("i");
            q.insert(("s", "stream", -7i128, 9u64, "e1"), ())
                .expect("i");
            let mut h = tx.open_table(t::HEADS).expect("h");
            h.insert("a/x", (3i128, "a/e", 10u64)).expect("i");
        }
        tx.commit().expect("c");
        let read = from.begin_read().expect("r");
        let write = to.begin_write().expect("w");
        for table in &TABLES {
            let mut rows: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
            table
                .each_row(&read, &mut |k, v| {
                    rows.push((k.to_vec(), v.to_vec()));
                    Ok(())
                })
                .expect("rows");
            let borrowed: Vec<(&[u8], &[u8])> = rows
                .iter()
                .map(|(k, v)| (k.as_slice(), v.as_slice()))
                .collect();
            table.insert(&write, &borrowed).expect("insert");
        }
        write.commit().expect("c");
        let back = to.begin_read().expect("r");
        let q = back.open_table(t::INBOX_QUEUE).expect("typed");
        let ids: Vec<String> = q
            .iter()
            .expect("iter")
            .map(|r| r.expect("row").0.value().4.to_owned())
            .collect();
        assert_eq!(ids, ["e1", "e2"], "in created_at order, as typed");
        let h = back.open_table(t::HEADS).expect("typed");
        assert_eq!(h.get("a/x").expect("get").expect("there").value().2, 10);
        assert!(t::INBOX_QUEUE.name() == TABLES[11].name());
    }
}
