"""Deterministic long-context finance QA: a report (table + paragraphs), several questions per report.

Shaped like public table-and-text finance QA sets: the user turn is an instruction, a company's figures
as a table, a varying number of narrative paragraphs, then the question; the answer is short and numeric
(a figure read from the table, a difference, or a percentage change, each computed here). Columns:
`system` (empty), `user`, `assistant`, and `doc_id`, the report a question is about (for a grouped split).
Document `d` depends only on the seed and `d`, so fewer rows give a prefix of more.
"""

from __future__ import annotations

import random

Row = dict[str, str]

INSTRUCTION = "Answer the question using the report below. Reply with the answer only."
COMPANIES = ["Northwind Bancorp", "Harbor Capital Group", "Alder Financial", "Crescent Lending", "Pinecrest Insurance",
             "Bluefield Payments", "Summit Trust", "Redwood Asset Management", "Ironbridge Holdings", "Lakeside Credit"]
METRICS = ["Net interest income", "Non-interest income", "Total revenue", "Operating expenses", "Provision for credit losses",
           "Net income", "Total loans", "Total deposits", "Total assets", "Shareholders' equity"]
FILLER = [
    "{company} operates through retail banking, commercial lending and wealth management segments.",
    "Management continued to invest in digital channels, and mobile users grew during the year.",
    "The board approved a quarterly dividend and a share repurchase programme within its capital plan.",
    "Credit quality remained stable, with delinquencies close to the levels of the prior year.",
    "The company's common equity tier 1 ratio stayed above the regulatory minimum throughout the period.",
    "Interest rate movements affected both the yield on loans and the cost of deposits.",
    "Headcount was broadly unchanged as branch consolidation offset hiring in technology and compliance.",
    "The outlook assumes moderate economic growth and no significant change in unemployment.",
    "Litigation and regulatory matters are described in the notes and were not material to the results.",
    "Fee income reflected higher card volumes and advisory mandates, partly offset by lower mortgage banking.",
    "Liquidity coverage remained comfortably above the requirement, supported by a stable deposit base.",
    "Goodwill was tested for impairment in the fourth quarter and no impairment was recognised.",
]


def _figure(value: int) -> str:
    return f"{'-' if value < 0 else ''}${abs(value):,} million"


def _table(metrics: list[str], years: list[int], values: dict[tuple[str, int], int]) -> str:
    lines = ["(in millions of USD) | " + " | ".join(str(y) for y in years)]
    lines += [f"{m} | " + " | ".join(f"{values[m, y]:,}" for y in years) for m in metrics]
    return "\n".join(lines)


def _paragraphs(rng: random.Random, company: str, metrics: list[str], years: list[int],
                values: dict[tuple[str, int], int]) -> list[str]:
    """Narrative paragraphs: some restate figures of the table, the rest is filler; 1 to 14 of them."""
    paragraphs = []
    for _ in range(rng.choices(range(1, 15), weights=[6, 10, 12, 12, 10, 9, 8, 7, 6, 5, 5, 4, 3, 3])[0]):
        metric, year = rng.choice(metrics), rng.choice(years)
        sentences = [rng.choice(FILLER).format(company=company) for _ in range(rng.randint(2, 4))]
        sentences.insert(rng.randint(0, len(sentences)), f"{metric} for {year} was {_figure(values[metric, year])}.")
        paragraphs.append(" ".join(sentences))
    return paragraphs


def _question(rng: random.Random, metrics: list[str], years: list[int], values: dict[tuple[str, int], int]
              ) -> tuple[str, str]:
    metric = rng.choice(metrics)
    kind = rng.choices(["lookup", "difference", "change"], weights=[60, 25, 15])[0]
    if kind == "lookup":
        year = rng.choice(years)
        return f"What was {metric.lower()} in {year}?", _figure(values[metric, year])
    first, second = sorted(rng.sample(years, 2))
    a, b = values[metric, first], values[metric, second]
    if kind == "difference":
        return f"By how much did {metric.lower()} change from {first} to {second}?", _figure(b - a)
    return (f"What was the percentage change in {metric.lower()} from {first} to {second}?",
            f"{(b - a) / a * 100:.1f}%")


def document(seed: int, index: int) -> list[Row]:
    """Report `index` for `seed` and its 2 to 5 distinct questions, one row per question."""
    rng = random.Random(f"qa-{seed}-{index}")
    company = rng.choice(COMPANIES)
    last = rng.randint(2019, 2025)
    years = list(range(last - rng.randint(1, 2), last + 1))
    metrics = rng.sample(METRICS, rng.randint(3, 6))
    values: dict[tuple[str, int], int] = {}
    for metric in metrics:
        value = rng.randint(120, 9_000)
        for year in years:
            values[metric, year] = value
            value = max(50, round(value * rng.uniform(0.85, 1.2)))
    report = "\n\n".join([f"{company} annual report {last}", _table(metrics, years, values),
                          *_paragraphs(rng, company, metrics, years, values)])
    questions: dict[str, str] = {}
    wanted = rng.randint(2, 5)
    for _ in range(4 * wanted):
        question, answer = _question(rng, metrics, years, values)
        questions.setdefault(question, answer)
        if len(questions) == wanted:
            break
    return [{"system": "", "user": f"{INSTRUCTION}\n\n{report}\n\nQuestion: {question}", "assistant": answer,
             "doc_id": f"doc-{seed}-{index}"} for question, answer in questions.items()]


def qa_rows(rows: int, seed: int) -> list[Row]:
    """The first `rows` question rows, documents in order."""
    out: list[Row] = []
    index = 0
    while len(out) < rows:
        out.extend(document(seed, index))
        index += 1
    return out[:rows]
