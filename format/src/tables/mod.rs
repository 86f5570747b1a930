//! Output tables. Each table is one file holding its row type's mapping to columns:
//! the [`define_table!`] invocation gives, per column, its name, Arrow type,
//! nullability, documentation (unit and clock included) and how it is computed from
//! a row. Adding a table is one new file plus one line in [`ALL_TABLES`].

use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_schema::{DataType, SchemaRef};

pub mod calls;
pub mod comms;
pub mod gpu;
pub mod nccl_comms;
pub mod nccl_ops;
pub mod ops;
pub mod phases;
pub mod process;
pub mod proxy;

pub use calls::CallsTable;
pub use comms::CommsTable;
pub use gpu::GpuTable;
pub use nccl_comms::NcclCommsTable;
pub use nccl_ops::NcclOpsTable;
pub use ops::OpsTable;
pub use phases::PhasesTable;
pub use process::{ProcessRow, ProcessTable};
pub use proxy::ProxyTable;

/// Per-process constants the writer adds to every row.
#[derive(Clone, Debug)]
pub struct Ctx {
    pub pid: i32,
    pub host: Arc<str>,
}

/// Documentation of one column (rendered into docs/schema.md and checked by a test).
#[derive(Clone, Copy, Debug)]
pub struct ColumnDoc {
    pub name: &'static str,
    pub arrow_type: &'static str,
    pub nullable: bool,
    pub doc: &'static str,
}

/// Columns whose Parquet encoding should be DELTA_BINARY_PACKED (monotone integers).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Encoding {
    Default,
    Delta,
}

/// A table: name, schema, documentation and a columnar builder for its rows.
pub trait Table: 'static {
    const NAME: &'static str;
    type Row;
    type Builder: RowBuilder<Self::Row> + Default + Send;
    fn schema() -> SchemaRef;
    fn columns() -> &'static [ColumnDoc];
    fn encodings() -> &'static [(&'static str, Encoding)];
}

/// Accumulates rows column by column.
pub trait RowBuilder<R> {
    fn append(&mut self, row: &R, ctx: &Ctx);
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Takes the rows appended so far as a batch and resets the builder.
    fn finish(&mut self, schema: &SchemaRef) -> Result<RecordBatch, arrow_schema::ArrowError>;
}

/// What generic code (reader, recovery, docs) needs to know of a table.
#[derive(Clone, Copy, Debug)]
pub struct TableInfo {
    pub name: &'static str,
    pub schema: fn() -> SchemaRef,
    pub columns: fn() -> &'static [ColumnDoc],
    /// Columns written with an encoding of their own.
    pub encodings: fn() -> &'static [(&'static str, Encoding)],
}

/// The [`TableInfo`] of `T`.
pub const fn info<T: Table>() -> TableInfo {
    TableInfo {
        name: T::NAME,
        schema: T::schema,
        columns: T::columns,
        encodings: T::encodings,
    }
}

/// Every table, in documentation order. Adding a table: one line here.
pub const TABLES: [TableInfo; 9] = [
    info::<OpsTable>(),
    info::<GpuTable>(),
    info::<CommsTable>(),
    info::<CallsTable>(),
    info::<NcclOpsTable>(),
    info::<ProxyTable>(),
    info::<NcclCommsTable>(),
    info::<PhasesTable>(),
    info::<ProcessTable>(),
];

/// Names of every table, in documentation order (`process` last: recovery relies on it).
pub const ALL_TABLES: [&str; 9] = [
    TABLES[0].name,
    TABLES[1].name,
    TABLES[2].name,
    TABLES[3].name,
    TABLES[4].name,
    TABLES[5].name,
    TABLES[6].name,
    TABLES[7].name,
    TABLES[8].name,
];

/// A table by name.
pub fn table(name: &str) -> Option<&'static TableInfo> {
    TABLES.iter().find(|t| t.name == name)
}

/// Column documentation of a table by name.
pub fn columns_of(name: &str) -> Option<&'static [ColumnDoc]> {
    table(name).map(|t| (t.columns)())
}

/// Schema of a table by name.
pub fn schema_of(name: &str) -> Option<SchemaRef> {
    table(name).map(|t| (t.schema)())
}

/// Markdown table of a table's columns (the body of its section in docs/schema.md).
pub fn markdown_columns(cols: &[ColumnDoc]) -> String {
    let mut s = String::from("| column | type | null | meaning |\n|---|---|---|---|\n");
    for c in cols {
        s.push_str(&format!(
            "| `{}` | {} | {} | {} |\n",
            c.name,
            c.arrow_type,
            if c.nullable { "yes" } else { "no" },
            c.doc
        ));
    }
    s
}

/// One column of a table, as a type. [`define_table!`] makes one per column, in the
/// table module's `columns` module; the read side names columns only through them
/// ([`read_view!`]), so a column renamed in its table's definition fails to compile
/// in every reader of it.
pub trait Column {
    type Kind: kind::ColumnKind;
    const NAME: &'static str;
}

/// One column of a batch, typed by its kind.
pub struct Col<K: kind::ColumnKind>(K::Array);

impl<K: kind::ColumnKind> Col<K> {
    /// Column `name` of `b`; `None` when `b` lacks it or holds another type.
    pub fn of(b: &RecordBatch, name: &str) -> Option<Self> {
        b.column_by_name(name).and_then(|a| K::cast(a)).cloned().map(Col)
    }
    /// Row `i`, `None` when NULL.
    #[inline]
    pub fn get(&self, i: usize) -> Option<K::Value<'_>> {
        use arrow_array::Array;
        self.0.is_valid(i).then(|| K::value(&self.0, i))
    }
    /// Row `i` whether NULL or not (a NULL row holds zero or the empty string).
    #[inline]
    pub fn value(&self, i: usize) -> K::Value<'_> {
        K::value(&self.0, i)
    }
    #[inline]
    pub fn is_null(&self, i: usize) -> bool {
        use arrow_array::Array;
        self.0.is_null(i)
    }
}

/// A typed view of the columns a reader uses of a table, and the projection it asks
/// Parquet for ([`reader::stream_file`](crate::reader::stream_file) and friends):
///
/// ```
/// zcta_format::read_view! {
///     struct Calls of calls { host, pid, call }
/// }
/// assert_eq!(Calls::COLUMNS, ["host", "pid", "call"]);
/// # let b = arrow_array::RecordBatch::new_empty(zcta_format::tables::schema_of("calls").unwrap());
/// let v = Calls::of(&b).unwrap();
/// let first_call: Option<&str> = (v.rows > 0).then(|| v.call.value(0));
/// # assert_eq!(first_call, None);
/// ```
///
/// `calls` is the table's module in [`tables`](crate::tables); each column is looked up
/// in its `columns` module, so a name that is not one of the table's columns does not
/// compile:
///
/// ```compile_fail
/// zcta_format::read_view! {
///     struct Calls of calls { host, pid, no_such_column }
/// }
/// ```
#[macro_export]
macro_rules! read_view {
    (
        $(#[$meta:meta])*
        $vis:vis struct $View:ident of $table:ident { $($col:ident),* $(,)? }
    ) => {
        $(#[$meta])*
        $vis struct $View {
            /// Rows of the batch.
            pub rows: usize,
            $(
                pub $col: $crate::tables::Col<
                    <$crate::tables::$table::columns::$col as $crate::tables::Column>::Kind,
                >,
            )*
        }

        impl $View {
            /// The columns it reads: the projection asked of Parquet.
            #[allow(dead_code)]
            pub const COLUMNS: &'static [&'static str] =
                &[$( <$crate::tables::$table::columns::$col as $crate::tables::Column>::NAME ),*];

            /// The view of `b`, a batch the reader aligned to the table's schema;
            /// `None` when a column is missing or of another type.
            #[allow(dead_code)]
            pub fn of(b: &arrow_array::RecordBatch) -> Option<Self> {
                Some(Self {
                    rows: b.num_rows(),
                    $(
                        $col: $crate::tables::Col::of(
                            b,
                            <$crate::tables::$table::columns::$col as $crate::tables::Column>::NAME,
                        )?,
                    )*
                })
            }
        }
    };
}

/// Arrow column kinds used by the tables.
pub mod kind {
    use super::*;
    use arrow_array::cast::AsArray;
    use arrow_array::types::{Int32Type, Int64Type, UInt32Type, UInt64Type};
    use arrow_array::{Array, BooleanArray, PrimitiveArray, StringArray};

    /// Mapping from a column kind to its Arrow type and array.
    pub trait ColumnKind {
        type Value<'a>;
        /// The array a reader finds the column in.
        type Array: Array + Clone + 'static;
        const TYPE_NAME: &'static str;
        fn data_type() -> DataType;
        /// The column of these values (a batch's, in row order).
        fn build<'a>(vals: impl Iterator<Item = Option<Self::Value<'a>>>) -> arrow_array::ArrayRef;
        /// `a` as this kind's array; `None` when it holds another type.
        fn cast(a: &dyn Array) -> Option<&Self::Array>;
        fn value(a: &Self::Array, i: usize) -> Self::Value<'_>;
    }

    macro_rules! prim_kind {
        ($k:ident, $v:ty, $dt:expr, $name:literal, $array:ty, $cast:ident $(:: <$t:ty>)?) => {
            #[derive(Debug)]
            pub struct $k;
            impl ColumnKind for $k {
                type Value<'a> = $v;
                type Array = $array;
                const TYPE_NAME: &'static str = $name;
                fn data_type() -> DataType {
                    $dt
                }
                #[inline]
                fn build<'a>(vals: impl Iterator<Item = Option<Self::Value<'a>>>) -> arrow_array::ArrayRef {
                    std::sync::Arc::new(<$array>::from_iter(vals))
                }
                #[inline]
                fn cast(a: &dyn Array) -> Option<&Self::Array> {
                    a.$cast$(::<$t>)?()
                }
                #[inline]
                fn value(a: &Self::Array, i: usize) -> $v {
                    a.value(i)
                }
            }
        };
    }
    prim_kind!(
        I32,
        i32,
        DataType::Int32,
        "int32",
        PrimitiveArray<Int32Type>,
        as_primitive_opt::<Int32Type>
    );
    prim_kind!(
        I64,
        i64,
        DataType::Int64,
        "int64",
        PrimitiveArray<Int64Type>,
        as_primitive_opt::<Int64Type>
    );
    prim_kind!(
        U32,
        u32,
        DataType::UInt32,
        "uint32",
        PrimitiveArray<UInt32Type>,
        as_primitive_opt::<UInt32Type>
    );
    prim_kind!(
        U64,
        u64,
        DataType::UInt64,
        "uint64",
        PrimitiveArray<UInt64Type>,
        as_primitive_opt::<UInt64Type>
    );
    prim_kind!(
        Bool,
        bool,
        DataType::Boolean,
        "bool",
        BooleanArray,
        as_boolean_opt
    );

    #[derive(Debug)]
    pub struct Utf8;
    impl ColumnKind for Utf8 {
        type Value<'a> = &'a str;
        type Array = StringArray;
        const TYPE_NAME: &'static str = "string";
        fn data_type() -> DataType {
            DataType::Utf8
        }
        #[inline]
        fn build<'a>(vals: impl Iterator<Item = Option<Self::Value<'a>>>) -> arrow_array::ArrayRef {
            std::sync::Arc::new(StringArray::from_iter(vals))
        }
        #[inline]
        fn cast(a: &dyn Array) -> Option<&StringArray> {
            a.as_string_opt::<i32>()
        }
        #[inline]
        fn value(a: &StringArray, i: usize) -> &str {
            a.value(i)
        }
    }
}

/// Defines a table: a marker type implementing [`Table`], its builder, and for the
/// read side a `columns` module with one [`Column`] type per column ([`read_view!`]).
///
/// ```ignore
/// define_table! {
///     pub struct OpsTable, OpsBuilder: "ops", row = OpRecord;
///     op: Utf8, required, default, "doc" => |r, c| Some(r.op.name());
/// }
/// ```
#[macro_export]
macro_rules! define_table {
    (
        $(#[$meta:meta])*
        $vis:vis struct $Table:ident, $Builder:ident : $name:literal, row = $Row:ty;
        $( $col:ident : $kind:ident, $null:ident, $enc:ident, $doc:literal => |$r:ident, $c:ident| $e:expr; )*
    ) => {
        $(#[$meta])*
        #[derive(Debug)]
        $vis struct $Table;

        #[doc = concat!("Column builder of the `", $name, "` table: keeps the rows, and builds")]
        #[doc = "the columns one at a time when the batch is taken (a tight loop per column,"]
        #[doc = "into arrays sized up front, costs the writer far less than a builder per column"]
        #[doc = "appended to row by row)."]
        #[derive(Default)]
        $vis struct $Builder {
            rows: Vec<($Row, $crate::tables::Ctx)>,
        }

        impl $crate::tables::RowBuilder<$Row> for $Builder {
            #[inline]
            fn append(&mut self, row: &$Row, ctx: &$crate::tables::Ctx) {
                self.rows.push((row.clone(), ctx.clone()));
            }
            fn len(&self) -> usize {
                self.rows.len()
            }
            #[allow(unused_variables)]
            fn finish(
                &mut self,
                schema: &arrow_schema::SchemaRef,
            ) -> Result<arrow_array::RecordBatch, arrow_schema::ArrowError> {
                let rows = &self.rows;
                let batch = arrow_array::RecordBatch::try_new(
                    schema.clone(),
                    vec![$(
                        <$crate::tables::kind::$kind as $crate::tables::kind::ColumnKind>::build(
                            rows.iter().map(|(row, ctx)| {
                                let $r = row;
                                let $c = ctx;
                                $e
                            }),
                        ),
                    )*],
                );
                // The next batch reuses the rows' memory.
                self.rows.clear();
                batch
            }
        }

        #[doc = concat!("The columns of the `", $name, "` table as types, for [`read_view!`](crate::read_view).")]
        #[allow(non_camel_case_types)]
        pub mod columns {
            $(
                #[doc = $doc]
                #[derive(Debug)]
                pub struct $col;
                impl $crate::tables::Column for $col {
                    type Kind = $crate::tables::kind::$kind;
                    const NAME: &'static str = stringify!($col);
                }
            )*
        }

        impl $crate::tables::Table for $Table {
            const NAME: &'static str = $name;
            type Row = $Row;
            type Builder = $Builder;
            fn schema() -> arrow_schema::SchemaRef {
                static SCHEMA: std::sync::OnceLock<arrow_schema::SchemaRef> = std::sync::OnceLock::new();
                SCHEMA
                    .get_or_init(|| {
                        let fields = vec![$(
                            arrow_schema::Field::new(
                                stringify!($col),
                                <$crate::tables::kind::$kind as $crate::tables::kind::ColumnKind>::data_type(),
                                $crate::define_table!(@nullable $null),
                            ),
                        )*];
                        let meta = std::collections::HashMap::from([
                            ($crate::SCHEMA_VERSION_KEY.to_string(), $crate::SCHEMA_VERSION.to_string()),
                            ($crate::TABLE_KEY.to_string(), $name.to_string()),
                        ]);
                        std::sync::Arc::new(arrow_schema::Schema::new_with_metadata(fields, meta))
                    })
                    .clone()
            }
            fn columns() -> &'static [$crate::tables::ColumnDoc] {
                &[$(
                    $crate::tables::ColumnDoc {
                        name: stringify!($col),
                        arrow_type: <$crate::tables::kind::$kind as $crate::tables::kind::ColumnKind>::TYPE_NAME,
                        nullable: $crate::define_table!(@nullable $null),
                        doc: $doc,
                    },
                )*]
            }
            fn encodings() -> &'static [(&'static str, $crate::tables::Encoding)] {
                &[$( (stringify!($col), $crate::define_table!(@enc $enc)), )*]
            }
        }
    };
    (@nullable nullable) => { true };
    (@nullable required) => { false };
    (@enc default) => { $crate::tables::Encoding::Default };
    (@enc delta) => { $crate::tables::Encoding::Delta };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// docs/schema.md must document every column exactly as the code defines it
    /// (regenerate the tables with `zcta schema`).
    #[test]
    fn schema_doc_is_current() {
        let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/schema.md")).unwrap();
        for t in ALL_TABLES {
            let section = format!("## `{t}`\n\n{}", markdown_columns(columns_of(t).unwrap()));
            assert!(
                doc.contains(&section),
                "docs/schema.md is out of date for table {t}: run `zcta schema`"
            );
        }
    }

    #[test]
    fn schemas_carry_version_and_match_docs() {
        for t in ALL_TABLES {
            let s = schema_of(t).unwrap();
            assert_eq!(
                s.metadata().get(crate::SCHEMA_VERSION_KEY).map(String::as_str),
                Some(crate::SCHEMA_VERSION.to_string().as_str())
            );
            let cols = columns_of(t).unwrap();
            assert_eq!(s.fields().len(), cols.len());
            for (f, c) in s.fields().iter().zip(cols) {
                assert_eq!(f.name(), c.name);
                assert_eq!(f.is_nullable(), c.nullable);
            }
        }
    }
}
