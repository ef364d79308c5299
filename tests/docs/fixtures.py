"""The files the commands of README.md and docs/ name, written into the folder they run in.

Each is small (the docs test is the slowest test of the suite) and made from what the
pages themselves say about them:

- ``tx.csv``: a Fraud Detection Handbook-format CSV (TRANSACTION_ID, TX_DATETIME, CUSTOMER_ID,
  TERMINAL_ID, TX_AMOUNT, TX_TIME_SECONDS, TX_TIME_DAYS, TX_FRAUD, TX_FRAUD_SCENARIO), the
  names ``train --columns`` maps;
- ``new.parquet``: transactions in the canonical columns (no label); ``incoming/tx/``: the
  last day of the data ``fraud adapt`` fine-tunes on by default (a day of its test period),
  unlabelled: a day of the regime the champion was adapted to, whose history (the days
  before it) the batch job reads from the champion's training table; ``incoming/next-days/``:
  two more days like ``new.parquet``'s, one file each (the Ray fan-out's batch);
- ``manuals/``, ``qa.jsonl``: a few documents (``docs/examples/manuals``) and questions with answers
  found in them;
- ``readings.csv`` / ``events.csv``: long-format sensor readings and failure events;
  ``incoming/sensor/``, ``failures/``: later readings of other assets and their failures;
- ``lease.pdf``, ``annex.docx``: the two documents uploaded to the ``legal`` collection.

Every file is older than the batch flows' settle time (30 s), as a file dropped earlier is.
"""

from __future__ import annotations

import os
import shutil
import time
import zipfile
from pathlib import Path

import pandas as pd

HANDBOOK_NAMES = {"transaction_id": "TRANSACTION_ID", "timestamp": "TX_DATETIME", "account_id": "CUSTOMER_ID",
                  "terminal_id": "TERMINAL_ID", "amount": "TX_AMOUNT", "label": "TX_FRAUD"}

#: A few maintenance documents (Markdown, HTML, text), shipped with the docs: README.md ingests them
#: from there, the RAG guide from ``manuals/``; ``qa.jsonl``'s answers are found in them.
MANUALS = Path(__file__).resolve().parents[2] / "docs" / "examples" / "manuals"

QA = [
    {"question": "How often is the mechanical seal of the pump replaced?", "answers": ["4,000 operating hours"]},
    {"question": "Which vibration velocity requires stopping the machine?", "answers": ["7.1 mm/s"]},
    {"question": "What is handed over with the alarm log at a shift change?", "answers": ["permit-to-work folder"]},
]

LEASE_TEXT = [
    "Commercial lease agreement",
    "The tenant may terminate this lease by written notice.",
    "The notice period is three months, ending on the last day of a calendar quarter.",
    "The monthly rent is payable in advance on the first working day of each month.",
]
ANNEX_TEXT = [
    "Annex A: technical installations",
    "The landlord maintains the heating and the lifts; the tenant maintains the kitchen equipment.",
    "Defects are reported in writing within fourteen days of their discovery.",
]


def handbook_csv(path: Path, seed: int = 1) -> None:
    """Transactions as the Fraud Detection Handbook writes them (upper-case names, seconds and days)."""
    from solutions.fraud.synthetic import generate_transactions

    df = generate_transactions(n_accounts=300, n_terminals=120, n_days=36, fraud_rate=0.02, seed=seed)
    start = df["timestamp"].min().normalize()
    seconds = (df["timestamp"] - start).dt.total_seconds().astype("int64")
    out = pd.DataFrame({
        "TRANSACTION_ID": range(len(df)),
        "TX_DATETIME": df["timestamp"].dt.strftime("%Y-%m-%d %H:%M:%S"),
        "CUSTOMER_ID": pd.factorize(df["account_id"])[0],
        "TERMINAL_ID": pd.factorize(df["terminal_id"])[0],
        "TX_AMOUNT": df["amount"].round(2),
        "TX_TIME_SECONDS": seconds,
        "TX_TIME_DAYS": seconds // 86400,
        "TX_FRAUD": df["label"].astype(int),
        "TX_FRAUD_SCENARIO": pd.factorize(df["scenario"])[0] if "scenario" in df else df["label"].astype(int),
    })
    out.to_csv(path, index=False)


def canonical_transactions(seed: int, n_days: int) -> pd.DataFrame:
    """The last ``n_days`` of a fleet of accounts like the default synthetic data's (same sizes, other
    seed), after a week of their history: the kind of file the trained champion scores next."""
    from solutions.fraud.synthetic import generate_transactions

    df = generate_transactions(n_days=n_days + 7, start="2025-02-20", seed=seed)
    df = df[df["timestamp"] >= df["timestamp"].max().normalize() - pd.Timedelta(days=n_days - 1)]
    return df.drop(columns=[c for c in ("label", "scenario") if c in df.columns]).reset_index(drop=True)


def last_day_of_the_adapted_data() -> pd.DataFrame:
    """The last day of ``fraud adapt``'s default data (its synthetic settings), without labels."""
    from flows.fraud.adapt import ADAPT_CONFIG
    from solutions.fraud.synthetic import generate_transactions

    cfg = ADAPT_CONFIG.data
    df = generate_transactions(n_accounts=cfg.n_accounts, n_terminals=cfg.n_terminals, n_days=cfg.n_days,
                               fraud_rate=cfg.fraud_rate, seed=cfg.seed, new_pattern=cfg.new_pattern)
    df = df[df["timestamp"] >= df["timestamp"].max().normalize()]
    return df.drop(columns=[c for c in ("label", "scenario") if c in df.columns]).reset_index(drop=True)


def sensor_files(cwd: Path) -> None:
    from solutions.sensor.config import SyntheticFleetConfig
    from solutions.sensor.synthetic import generate_fleet

    readings, events = generate_fleet(SyntheticFleetConfig(
        n_assets=16, min_life=90, max_life=150, fast_rate=4, bad_reading_rate=0.0, censored_fraction=0.1, seed=3))
    readings.to_csv(cwd / "readings.csv", index=False)
    events.to_csv(cwd / "events.csv", index=False)
    # later: other assets' readings up to a point before they failed, then their failures
    later, later_events = generate_fleet(SyntheticFleetConfig(
        n_assets=12, min_life=90, max_life=150, fast_rate=4, bad_reading_rate=0.0, censored_fraction=0.0, seed=4))
    later["asset_id"] = "L-" + later["asset_id"].astype(str)
    later_events["asset_id"] = "L-" + later_events["asset_id"].astype(str)
    cut = later.groupby("asset_id")["timestamp"].transform(lambda t: t.min() + (t.max() - t.min()) * 0.7)
    inbox = cwd / "incoming" / "sensor"
    inbox.mkdir(parents=True)
    later[later["timestamp"] <= cut].to_csv(inbox / "line-2.csv", index=False)
    failures = cwd / "failures"
    failures.mkdir()
    pd.DataFrame({"asset_id": later_events["asset_id"], "failed_at": later_events["failure_time"]}).to_csv(
        failures / "failures.csv", index=False)


def _pdf(lines: list[str]) -> bytes:
    """A one-page PDF with a text layer (Helvetica), written object by object."""
    text = " ".join(f"({line}) Tj T*" for line in lines)
    stream = f"BT /F1 12 Tf 16 TL 72 720 Td {text} ET".encode("latin-1")
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        (b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R "
        b"/Resources << /Font << /F1 5 0 R >> >> >>"),
        b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding >>",
    ]
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for i, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % i + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % o for o in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)
    return bytes(out)


def _docx(lines: list[str]) -> bytes:
    """A minimal Word document (the three parts a .docx needs)."""
    import io

    w = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"
    body = "".join(f"<w:p><w:r><w:t>{line}</w:t></w:r></w:p>" for line in lines)
    parts = {
        "[Content_Types].xml": (
            '<?xml version="1.0" encoding="UTF-8"?><Types xmlns="http://schemas.openxmlformats.org/package/2006/'
            'content-types"><Default Extension="rels" ContentType="application/vnd.openxmlformats-package.'
            'relationships+xml"/><Default Extension="xml" ContentType="application/xml"/><Override PartName="/word/'
            'document.xml" ContentType="application/vnd.openxmlformats-officedocument.wordprocessingml.document.'
            'main+xml"/></Types>'),
        "_rels/.rels": (
            '<?xml version="1.0" encoding="UTF-8"?><Relationships xmlns="http://schemas.openxmlformats.org/package/'
            '2006/relationships"><Relationship Id="rId1" Type="http://schemas.openxmlformats.org/officeDocument/'
            '2006/relationships/officeDocument" Target="word/document.xml"/></Relationships>'),
        "word/document.xml": (
            f'<?xml version="1.0" encoding="UTF-8"?><w:document xmlns:w="{w}"><w:body>{body}</w:body></w:document>'),
    }
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, xml in parts.items():
            zf.writestr(name, xml)
    return buf.getvalue()


def write_all(cwd: Path) -> list[str]:
    """Writes every fixture into ``cwd``; returns their names (for the harness's report)."""
    import json

    handbook_csv(cwd / "tx.csv")
    canonical_transactions(seed=2, n_days=1).to_parquet(cwd / "new.parquet", index=False)
    inbox = cwd / "incoming" / "tx"
    inbox.mkdir(parents=True)
    last_day_of_the_adapted_data().to_csv(inbox / "day-1.csv", index=False)
    later = cwd / "incoming" / "next-days"
    later.mkdir()
    days = canonical_transactions(seed=3, n_days=2)
    for i, (_, day) in enumerate(days.groupby(days["timestamp"].dt.normalize())):
        day.to_csv(later / f"day-{i + 2}.csv", index=False)
    shutil.copytree(MANUALS, cwd / "manuals")
    (cwd / "qa.jsonl").write_text("".join(json.dumps(q) + "\n" for q in QA), encoding="utf-8")
    sensor_files(cwd)
    (cwd / "lease.pdf").write_bytes(_pdf(LEASE_TEXT))
    (cwd / "annex.docx").write_bytes(_docx(ANNEX_TEXT))
    an_hour_ago = time.time() - 3600
    names = []
    for path in sorted(cwd.rglob("*")):
        if path.is_file() and not path.is_symlink():
            os.utime(path, (an_hour_ago, an_hour_ago))
            names.append(str(path.relative_to(cwd)))
    return names
