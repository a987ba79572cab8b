"""The participants' access cards: namespace, JupyterLab URL and notebook token, as CSV or a printable page.

Read from the workshop.json and the tokens that ``helpers.cluster.overlays.render`` stored; written with
mode 600. Secret values go only to the cards file, never to stdout, and a card's repr shows no token.
"""

from __future__ import annotations

import csv
import html
import io
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from helpers.cluster.kubectl import ProvisionError
from helpers.cluster.overlays import DEFAULT_OUT_DIR, SECRETS_DIR, load_workshop


@dataclass(frozen=True)
class Card:
    """What one participant needs to start: their namespace, URL and notebook token."""

    participant: str
    namespace: str
    url: str
    token: str = field(repr=False)
    note: str = ""


def access_cards(out_dir: Path | str = DEFAULT_OUT_DIR) -> list[Card]:
    """One card per provisioned participant, from workshop.json and the stored tokens."""
    ws = load_workshop(out_dir)
    cards = []
    for number, ns in enumerate(ws.namespaces(), start=1):
        token_file = Path(out_dir) / ns / SECRETS_DIR / "notebook-token"
        if not token_file.is_file():
            raise ProvisionError(f"{token_file} is missing: run `workshop provision` again with the same settings")
        if ws.domain:
            url, note = f"https://{ns}.{ws.domain}/lab", ""
        else:
            url = "http://localhost:8888/lab"
            note = f"no --domain: kubectl -n {ns} port-forward svc/notebook 8888:8888"
        cards.append(Card(f"{number:02d}", ns, url, token_file.read_text().strip(), note))
    return cards


def cards_csv(cards: Sequence[Card]) -> str:
    """The cards as CSV: participant, namespace, url, token, note."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["participant", "namespace", "url", "token", "note"])
    for c in cards:
        writer.writerow([c.participant, c.namespace, c.url, c.token, c.note])
    return buf.getvalue()


def cards_html(cards: Sequence[Card], title: str = "Own your inference: your lab") -> str:
    """The cards as a printable HTML page, one card per participant."""
    e = html.escape
    items = "\n".join(
        f'<div class="card"><h2>Participant {e(c.participant)}</h2>'
        f"<p>Namespace: <code>{e(c.namespace)}</code></p>"
        f'<p>JupyterLab: <a href="{e(c.url)}">{e(c.url)}</a></p>'
        f"<p>Token: <code>{e(c.token)}</code></p>"
        + (f'<p class="note">{e(c.note)}</p>' if c.note else "") + "</div>"
        for c in cards)
    return ("<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>" + e(title) + "</title><style>"
            "body{font-family:sans-serif} .card{border:1px solid #444;border-radius:8px;padding:12px;margin:12px;"
            "width:28em;display:inline-block;vertical-align:top;page-break-inside:avoid} code{font-size:1.05em}"
            ".note{color:#555;font-size:.9em}</style></head><body>\n" + items + "\n</body></html>\n")


def write_cards(out_dir: Path | str = DEFAULT_OUT_DIR, fmt: str = "csv", out_file: Path | str | None = None) -> Path:
    """Write the access cards (csv or html) with mode 600; return the file's path."""
    if fmt not in ("csv", "html"):
        raise ProvisionError(f"--format must be csv or html (got {fmt!r})")
    cards = access_cards(out_dir)
    text = cards_csv(cards) if fmt == "csv" else cards_html(cards)
    path = Path(out_file) if out_file else Path(out_dir) / f"cards.{fmt}"
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(path, 0o600)  # also when the file existed with wider permissions
    return path
