"""Canonical transaction schema of the fraud vertical.

Every loader, generator and feature builder in :mod:`solutions.fraud` speaks these
column names. Real-format data is brought to them with a :class:`ColumnMapping`
(e.g. the ULB/Worldline simulator's ``CUSTOMER_ID``/``TX_DATETIME``/``TX_AMOUNT``).
"""

from __future__ import annotations

import pandas as pd

from infra.tables import CanonicalMapping, ColumnKind, ColumnSpec, TableSchema, describe_columns

TRANSACTION_ID = "transaction_id"
ACCOUNT_ID = "account_id"
TIMESTAMP = "timestamp"
AMOUNT = "amount"
LABEL = "label"
TERMINAL_ID = "terminal_id"
CATEGORY = "category"
CHANNEL = "channel"
AGE = "age"
OCCUPATION = "occupation"
ACCOUNT_AGE_DAYS = "account_age_days"
#: Ground-truth fraud scenario of the synthetic generator ("" for legit rows).
#: Only for analysis; it is never a model feature.
SCENARIO = "scenario"

REQUIRED: tuple[str, ...] = (TRANSACTION_ID, ACCOUNT_ID, TIMESTAMP, AMOUNT, LABEL)
OPTIONAL: tuple[str, ...] = (
    TERMINAL_ID,
    CATEGORY,
    CHANNEL,
    AGE,
    OCCUPATION,
    ACCOUNT_AGE_DAYS,
)
#: Every canonical column a mapping may target.
CANONICAL: tuple[str, ...] = REQUIRED + OPTIONAL + (SCENARIO,)


class ColumnMapping(CanonicalMapping):
    """Maps canonical column names to the column names of a source table.

    Attributes:
        columns: canonical name -> source column name. Canonical columns that are
            not mapped are expected under their canonical name already.

    Example:
        >>> m = ColumnMapping.parse("account_id=CUSTOMER_ID,timestamp=TX_DATETIME")
        >>> m.columns["account_id"]
        'CUSTOMER_ID'
    """

    canonical = CANONICAL

    @classmethod
    def parse(cls, spec: str) -> ColumnMapping:
        """Parses ``"canonical=source,canonical=source"``.

        Whitespace around tokens is ignored; an empty spec gives the identity mapping.

        Args:
            spec: comma-separated ``canonical=source`` pairs.

        Returns:
            The mapping.

        Raises:
            ValueError: a token lacks ``=``, has an empty side, names an unknown
                canonical column, or repeats a canonical column. The message names
                the bad token and lists the valid canonical names.
        """
        columns: dict[str, str] = {}
        valid = ", ".join(CANONICAL)
        for raw in spec.split(","):
            token = raw.strip()
            if not token:
                continue
            if "=" not in token:
                raise ValueError(
                    f"bad column mapping token {token!r}: expected canonical=source "
                    f"(valid canonical names: {valid})"
                )
            key, _, value = (part.strip() for part in token.partition("="))
            if key not in CANONICAL:
                raise ValueError(
                    f"bad column mapping token {token!r}: unknown canonical column "
                    f"{key!r} (valid canonical names: {valid})"
                )
            if not value:
                raise ValueError(f"bad column mapping token {token!r}: empty source column name")
            if key in columns:
                raise ValueError(f"bad column mapping token {token!r}: canonical column {key!r} mapped twice")
            columns[key] = value
        return cls(columns)

    def apply(self, df: pd.DataFrame) -> pd.DataFrame:
        """Renames the mapped source columns of ``df`` to their canonical names.

        Args:
            df: a source table.

        Returns:
            A new frame with the mapped columns renamed; other columns unchanged.

        Raises:
            ValueError: a mapped source column is absent from ``df`` (the message
                lists ``df``'s columns).
        """
        for canonical, source in self.columns.items():
            if source not in df.columns:
                raise ValueError(
                    f"source column {source!r} (mapped to {canonical!r}) not found; "
                    f"available columns: {describe_columns(df.columns)}"
                )
        for canonical, source in self.columns.items():
            if canonical != source and canonical in df.columns and (canonical not in self.columns.values()):
                raise ValueError(
                    f"cannot rename {source!r} to {canonical!r}: the frame already has "
                    f"a column {canonical!r}; drop it or map it elsewhere first"
                )
        rename = {source: canonical for canonical, source in self.columns.items()}
        return df.rename(columns=rename)


#: (column, kind, required, nullable) of the transactions table: the one list that validation
#: (:func:`solutions.fraud.pipeline.transaction_schema`) and the CLI's pre-flight check
#: (:func:`preflight_schema`, which must not import the model code) both read.
TRANSACTION_COLUMNS: tuple[tuple[str, ColumnKind, bool, bool], ...] = (
    (TRANSACTION_ID, "id", True, False),
    (ACCOUNT_ID, "id", True, False),
    (TIMESTAMP, "datetime", True, False),
    (AMOUNT, "float", True, False),
    (LABEL, "binary", True, False),
    (TERMINAL_ID, "id", False, True),
    (CATEGORY, "category", False, True),
    (CHANNEL, "category", False, True),
    (AGE, "float", False, True),
    (OCCUPATION, "category", False, True),
    (ACCOUNT_AGE_DAYS, "float", False, True),
    (SCENARIO, "str", False, True),
)


#: When a label became known (optional in a labels file; the latest label of a transaction wins).
LABELLED_AT = "labelled_at"


def labels_schema(placed: bool = False) -> TableSchema:
    """Labels that became known after scoring (chargebacks, investigations): ``transaction_id,
    label[,labelled_at]``. One definition for the monitor's label files (joined to past scores by
    transaction id) and the server's label feedback, which is ``placed``: it also says where the
    transaction sat, its ``terminal_id`` and ``timestamp`` as scored, because the online state files
    the label in that terminal's delayed windows at that time."""
    placement = (ColumnSpec(name=TERMINAL_ID, kind="id"), ColumnSpec(name=TIMESTAMP, kind="datetime")) if placed else ()
    return TableSchema(
        name="fraud-labels",
        columns=(
            ColumnSpec(name=TRANSACTION_ID, kind="id"),
            *placement,
            ColumnSpec(name=LABEL, kind="binary"),
            ColumnSpec(name=LABELLED_AT, kind="datetime", required=False, nullable=True),
        ),
        min_rows=1,
    )


def transaction_columns(for_scoring: bool = False) -> tuple[tuple[str, ColumnKind, bool, bool], ...]:
    """:data:`TRANSACTION_COLUMNS`, with the label optional when scoring (unknown then)."""
    if not for_scoring:
        return TRANSACTION_COLUMNS
    return tuple((n, k, False, True) if n == LABEL else (n, k, r, nl) for n, k, r, nl in TRANSACTION_COLUMNS)


def preflight_schema(for_scoring: bool = False) -> TableSchema:
    """The required columns and their kinds (the label only when training), nothing else."""
    return TableSchema(
        name="fraud-transactions-preflight",
        columns=tuple(ColumnSpec(name=name, kind=kind)
                      for name, kind, required, _ in transaction_columns(for_scoring) if required),
    )
