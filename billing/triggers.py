"""Database triggers that make a finalised statement immutable, whatever the application does.

UPDATE/DELETE of a finalised statement and INSERT/UPDATE/DELETE of its lines are refused with an
integrity error. Used by migrations. SQLite drops a table's triggers when Django rebuilds the
table (most AlterField/AddField on SQLite), so a migration that touches billing_statement or
billing_statementline must call recreate_sqlite() after it.
"""

from __future__ import annotations

POSTGRES_UP = """
CREATE OR REPLACE FUNCTION billing_refuse_finalised_statement() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'billing: statement % is finalised and never changes', OLD.id
        USING ERRCODE = 'integrity_constraint_violation';
END;
$$ LANGUAGE plpgsql;

CREATE TRIGGER billing_statement_finalised
    BEFORE UPDATE OR DELETE ON billing_statement
    FOR EACH ROW WHEN (OLD.state = 'finalised')
    EXECUTE FUNCTION billing_refuse_finalised_statement();

CREATE OR REPLACE FUNCTION billing_refuse_finalised_line() RETURNS trigger AS $$
BEGIN
    IF (TG_OP IN ('UPDATE', 'DELETE') AND EXISTS (
            SELECT 1 FROM billing_statement WHERE id = OLD.statement_id AND state = 'finalised'))
       OR (TG_OP IN ('INSERT', 'UPDATE') AND EXISTS (
            SELECT 1 FROM billing_statement WHERE id = NEW.statement_id AND state = 'finalised')) THEN
        RAISE EXCEPTION 'billing: lines of a finalised statement never change'
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    IF TG_OP = 'DELETE' THEN
        RETURN OLD;
    END IF;
    RETURN NEW;
END;
$$ LANGUAGE plpgsql;

CREATE TRIGGER billing_statementline_finalised
    BEFORE INSERT OR UPDATE OR DELETE ON billing_statementline
    FOR EACH ROW EXECUTE FUNCTION billing_refuse_finalised_line();
"""

POSTGRES_DOWN = """
DROP TRIGGER IF EXISTS billing_statementline_finalised ON billing_statementline;
DROP FUNCTION IF EXISTS billing_refuse_finalised_line();
DROP TRIGGER IF EXISTS billing_statement_finalised ON billing_statement;
DROP FUNCTION IF EXISTS billing_refuse_finalised_statement();
"""

_FINALISED = "(SELECT state FROM billing_statement WHERE id = {}.statement_id) = 'finalised'"
_ABORT_STATEMENT = "BEGIN SELECT RAISE(ABORT, 'billing: statement is finalised and never changes'); END"
_ABORT_LINE = "BEGIN SELECT RAISE(ABORT, 'billing: lines of a finalised statement never change'); END"

SQLITE_UP = [
    "CREATE TRIGGER billing_statement_finalised_update BEFORE UPDATE ON billing_statement "
    f"FOR EACH ROW WHEN OLD.state = 'finalised' {_ABORT_STATEMENT}",
    "CREATE TRIGGER billing_statement_finalised_delete BEFORE DELETE ON billing_statement "
    f"FOR EACH ROW WHEN OLD.state = 'finalised' {_ABORT_STATEMENT}",
    "CREATE TRIGGER billing_statementline_finalised_insert BEFORE INSERT ON billing_statementline "
    f"FOR EACH ROW WHEN {_FINALISED.format('NEW')} {_ABORT_LINE}",
    "CREATE TRIGGER billing_statementline_finalised_update BEFORE UPDATE ON billing_statementline "
    f"FOR EACH ROW WHEN {_FINALISED.format('OLD')} OR {_FINALISED.format('NEW')} {_ABORT_LINE}",
    "CREATE TRIGGER billing_statementline_finalised_delete BEFORE DELETE ON billing_statementline "
    f"FOR EACH ROW WHEN {_FINALISED.format('OLD')} {_ABORT_LINE}",
]
SQLITE_DOWN = [
    f"DROP TRIGGER IF EXISTS {name}"
    for name in (
        "billing_statement_finalised_update",
        "billing_statement_finalised_delete",
        "billing_statementline_finalised_insert",
        "billing_statementline_finalised_update",
        "billing_statementline_finalised_delete",
    )
]


def create(schema_editor) -> None:
    if schema_editor.connection.vendor == "postgresql":
        with schema_editor.connection.cursor() as cursor:
            cursor.execute(POSTGRES_UP)
    elif schema_editor.connection.vendor == "sqlite":
        for sql in SQLITE_UP:
            schema_editor.execute(sql)


def drop(schema_editor) -> None:
    if schema_editor.connection.vendor == "postgresql":
        with schema_editor.connection.cursor() as cursor:
            cursor.execute(POSTGRES_DOWN)
    elif schema_editor.connection.vendor == "sqlite":
        for sql in SQLITE_DOWN:
            schema_editor.execute(sql)


def recreate_sqlite(apps, schema_editor) -> None:
    """RunPython step: put the SQLite triggers back after a table rebuild (no-op elsewhere)."""
    if schema_editor.connection.vendor == "sqlite":
        for sql in SQLITE_DOWN + SQLITE_UP:
            schema_editor.execute(sql)
