"""Deterministic synthetic retail-banking conversations (columns system, user, assistant).

Each topic builds one question and an answer whose figures are computed, not invented; the answer
length varies from one sentence to several paragraphs, as in Finance-Instruct-500k.
"""

from __future__ import annotations

import random
from collections.abc import Callable

Row = dict[str, str]

SYSTEM_PROMPTS = [
    "You are InnovationBank's virtual assistant. Answer clearly and accurately; never give personalised investment advice.",
    "You are a helpful assistant for retail banking customers.",
    "You are a financial education assistant. Explain concepts in plain language.",
    "You are a customer-service agent for a regulated bank. Follow compliance rules and protect customer data.",
    "Answer the finance question concisely.",
]

CURRENCIES = [("USD", "EUR", 0.92), ("EUR", "USD", 1.09), ("GBP", "USD", 1.27), ("USD", "JPY", 151.3),
              ("EUR", "GBP", 0.86), ("USD", "CAD", 1.36), ("CHF", "EUR", 1.04), ("AUD", "USD", 0.66)]


def _money(x: float) -> str:
    return f"${x:,.2f}"


def _pick(rng: random.Random, items: list[str]) -> str:
    return items[rng.randrange(len(items))]


def _length(rng: random.Random) -> int:
    """How many optional paragraphs to add: mostly short or medium answers, a long tail of long ones."""
    return rng.choices([0, 1, 2, 3, 4], weights=[30, 30, 20, 12, 8])[0]


def _extend(rng: random.Random, core: list[str], extras: list[str], detail: str | None = None) -> str:
    """Core answer plus a random number of extra paragraphs; now and then a long worked detail at the end."""
    extra = rng.sample(extras, min(_length(rng), len(extras)))
    tail = [detail] if detail and rng.random() < 0.25 else []
    return "\n\n".join(core + extra + tail)


def _schedule(principal: float, annual_rate: float, months: int, shown: int) -> str:
    """The first `shown` lines of an amortization table."""
    pay = _payment(principal, annual_rate, months)
    lines = ["Month | Payment | Interest | Principal | Balance"]
    balance = principal
    for month in range(1, min(shown, months) + 1):
        interest = balance * annual_rate / 12
        balance -= pay - interest
        lines.append(f"{month} | {_money(pay)} | {_money(interest)} | {_money(pay - interest)} | {_money(max(balance, 0))}")
    return "Here is how the first payments split between interest and principal:\n\n" + "\n".join(lines)


def _growth(deposit: float, apy: float, years: int) -> str:
    lines = ["Year | Balance | Interest earned that year"]
    balance = deposit
    for year in range(1, years + 1):
        interest = balance * apy
        balance += interest
        lines.append(f"{year} | {_money(balance)} | {_money(interest)}")
    return "Year by year, without further deposits:\n\n" + "\n".join(lines)


def _payment(principal: float, annual_rate: float, months: int) -> float:
    r = annual_rate / 12
    return principal / months if r == 0 else principal * r / (1 - (1 + r) ** -months)


def loan(rng: random.Random) -> Row:
    principal = rng.choice([5_000, 8_500, 12_000, 15_000, 20_000, 25_000, 35_000])
    rate = rng.choice([0.049, 0.065, 0.079, 0.089, 0.105, 0.12])
    years = rng.choice([2, 3, 4, 5, 7])
    months = years * 12
    pay = _payment(principal, rate, months)
    total_interest = pay * months - principal
    user = _pick(rng, [
        f"If I borrow {_money(principal)} at {rate:.1%} APR for {years} years, what will my monthly payment be?",
        f"What's the monthly payment on a {years}-year personal loan of {_money(principal)} with a {rate:.1%} interest rate?",
        f"I'm looking at a {_money(principal)} loan, {rate:.1%} APR, {months} months. How much will I pay each month and in total interest?",
    ])
    core = [f"Your monthly payment would be about {_money(pay)}. Over {months} months you would repay "
            f"{_money(pay * months)} in total, of which {_money(total_interest)} is interest."]
    extras = [
        f"This uses the standard amortization formula: payment = P x r / (1 - (1 + r)^-n), with P = {_money(principal)}, "
        f"a monthly rate r = {rate:.1%} / 12 = {rate / 12:.4%} and n = {months} payments.",
        f"Early payments are mostly interest: the first month's interest is {_money(principal * rate / 12)}, so only "
        f"{_money(pay - principal * rate / 12)} of the first payment reduces the balance.",
        f"A shorter term raises the payment but cuts interest. Over {max(1, years - 1)} years the payment would be "
        f"{_money(_payment(principal, rate, max(1, years - 1) * 12))}.",
        "Check whether the lender charges an origination fee or an early-repayment penalty; both change the true cost, "
        "which the APR on your loan agreement should reflect.",
    ]
    detail = _schedule(principal, rate, months, rng.choice([6, 12, 24]))
    return {"user": user, "assistant": _extend(rng, core, extras, detail)}


def savings(rng: random.Random) -> Row:
    deposit = rng.choice([1_000, 2_500, 5_000, 10_000, 20_000, 50_000])
    apy = rng.choice([0.015, 0.025, 0.035, 0.0425, 0.05])
    years = rng.choice([1, 3, 5, 10, 15])
    monthly = rng.choice([0, 0, 100, 200, 500])
    balance = deposit * (1 + apy) ** years
    r = (1 + apy) ** (1 / 12) - 1
    contributions = monthly * (((1 + r) ** (years * 12) - 1) / r) if monthly else 0.0
    total = balance + contributions
    add = f" and add {_money(monthly)} every month" if monthly else ""
    user = _pick(rng, [
        f"How much will I have if I put {_money(deposit)} in a savings account paying {apy:.2%} APY for {years} years{add}?",
        f"If I deposit {_money(deposit)} at {apy:.2%} APY{add}, what will it grow to after {years} years?",
    ])
    core = [f"After {years} years you would have about {_money(total)}, assuming the {apy:.2%} APY stays the same."]
    extras = [
        f"The initial deposit grows to {_money(balance)} by compounding: {_money(deposit)} x (1 + {apy:.4f})^{years}."
        + (f" The monthly deposits add {_money(contributions)}, of which {_money(contributions - monthly * years * 12)} is interest." if monthly else ""),
        "APY already includes the effect of compounding, so you can compare accounts by their APY directly.",
        "Savings rates are variable: if the central bank cuts rates, the account rate usually follows within weeks.",
        "Deposits at an insured bank are protected up to the deposit-insurance limit per depositor, per bank.",
    ]
    return {"user": user, "assistant": _extend(rng, core, extras, _growth(deposit, apy, years))}


def rates(rng: random.Random) -> Row:
    apr = rng.choice([0.03, 0.045, 0.06, 0.12, 0.1899, 0.2499])
    n = rng.choice([(12, "monthly"), (365, "daily"), (4, "quarterly")])
    apy = (1 + apr / n[0]) ** n[0] - 1
    kind = rng.randrange(3)
    if kind == 0:
        user = _pick(rng, ["What's the difference between APR and APY?", "Is APR the same as APY?",
                           f"My account says {apr:.2%} APR compounded {n[1]}. What is the APY?"])
        core = [f"APR is the yearly rate without compounding; APY includes compounding. At {apr:.2%} APR compounded "
                f"{n[1]}, the APY is (1 + {apr:.4f}/{n[0]})^{n[0]} - 1 = {apy:.2%}."]
        extras = ["Banks quote APY on savings because it is the larger number, and APR on loans because it is the smaller one.",
                  "For loans, the APR also folds in most mandatory fees, which makes it the better number for comparing offers.",
                  f"The gap grows with the rate: at {apr:.2%} it is {apy - apr:.2%} points."]
    elif kind == 1:
        change = rng.choice([0.25, 0.5, 0.75])
        direction = rng.choice(["raises", "cuts"])
        user = f"The central bank {direction} its policy rate by {change:.2f} percentage points. What does that mean for me?"
        up = direction == "raises"
        core = [f"Variable-rate borrowing such as credit cards and adjustable mortgages usually becomes {'more' if up else 'less'} "
                f"expensive within one or two billing cycles, and savings rates tend to {'rise' if up else 'fall'}, usually more slowly."]
        extras = ["Fixed-rate loans you already have do not change; only new fixed-rate offers move.",
                  f"On a $200,000 variable-rate balance, {change:.2f} points is about {_money(200_000 * change / 100 / 12)} a month in interest.",
                  "Bond prices move opposite to rates, so bond funds in a retirement account may show a temporary change in value."]
    else:
        inflation = rng.choice([0.02, 0.031, 0.045, 0.065])
        real = (1 + apr) / (1 + inflation) - 1
        user = f"My deposit earns {apr:.2%} but inflation is {inflation:.1%}. What's my real return?"
        core = [f"Your real return is about {real:.2%}: (1 + {apr:.4f}) / (1 + {inflation:.3f}) - 1."
                + (" Your purchasing power is shrinking." if real < 0 else " Your purchasing power is growing.")]
        extras = ["The quick approximation is nominal rate minus inflation, which gives "
                  f"{apr - inflation:.2%}; it is close when both rates are small.",
                  "Interest is usually taxed on the nominal amount, so the after-tax real return is lower still."]
    return {"user": user, "assistant": _extend(rng, core, extras)}


def fees(rng: random.Random) -> Row:
    fee = rng.choice(["overdraft", "monthly maintenance", "foreign transaction", "wire transfer", "ATM", "late payment"])
    amount = {"overdraft": 35, "monthly maintenance": 12, "foreign transaction": 3, "wire transfer": 25, "ATM": 3.5,
              "late payment": 40}[fee]
    user = _pick(rng, [f"Why was I charged a {fee} fee?", f"How can I avoid the {fee} fee on my account?",
                       f"Can you refund the {fee} fee I was charged last week?"])
    reasons = {
        "overdraft": "a payment went through when your balance was too low to cover it",
        "monthly maintenance": "the account fell below the minimum balance or direct-deposit requirement that month",
        "foreign transaction": f"a card purchase was processed in another currency or by a merchant abroad ({amount}% of the amount)",
        "wire transfer": "outgoing wires are processed manually and sent through the correspondent network",
        "ATM": "you used an ATM outside our network",
        "late payment": "the minimum payment was not received by the due date",
    }
    core = [f"A {fee} fee is charged when {reasons[fee]}."]
    extras = [
        "I can't see or change your account from this chat, but you can request a one-time courtesy refund in the app "
        "under Help > Dispute a fee, or by calling the number on the back of your card.",
        {"overdraft": "Turning on overdraft protection links your savings account, and low-balance alerts warn you first.",
         "monthly maintenance": "Keeping the minimum daily balance or setting up a monthly direct deposit waives the fee.",
         "foreign transaction": "A travel card with no foreign transaction fee avoids it; always pay in the local currency.",
         "wire transfer": "Transfers between our customers and standard bank transfers are free but take one to two days.",
         "ATM": "Our app's ATM locator shows the fee-free machines near you.",
         "late payment": "Autopay for at least the minimum payment prevents it; a late payment may also raise your rate."}[fee],
        f"Our standard {fee} fee is {_money(amount) if fee != 'foreign transaction' else f'{amount}%'}; the full list is in the fee schedule.",
    ]
    return {"user": user, "assistant": _extend(rng, core, extras)}


def cards(rng: random.Random) -> Row:
    balance = rng.choice([800, 1_500, 2_750, 4_200, 6_000])
    apr = rng.choice([0.1799, 0.2199, 0.2499, 0.2799])
    limit = rng.choice([2_000, 5_000, 8_000, 10_000])
    utilization = balance / limit
    kind = rng.randrange(3)
    if kind == 0:
        user = f"I have a {_money(balance)} credit card balance at {apr:.2%} APR. How much interest will I pay this month?"
        interest = balance * apr / 12
        core = [f"About {_money(interest)} if the balance stays at {_money(balance)} all month: {_money(balance)} x {apr:.2%} / 12."]
        extras = ["Card issuers actually charge on the average daily balance, so payments made early in the cycle reduce it.",
                  "Paying the statement balance in full by the due date keeps the grace period, and then purchases cost no interest.",
                  f"Paying only a 2% minimum would take years; paying {_money(balance / 12 + interest)} a month clears it in about a year."]
    elif kind == 1:
        user = f"My limit is {_money(limit)} and I owe {_money(balance)}. Does that hurt my credit score?"
        core = [f"Your utilization is {utilization:.0%}. Scores generally favour keeping it below 30%, and below 10% is better."]
        extras = ["Utilization is measured on the statement balance, so paying before the statement closes lowers it.",
                  "Asking for a higher limit also lowers utilization, but it may cause a hard inquiry.",
                  "Utilization has no memory: once the balance is paid down, the score usually recovers at the next report."]
    else:
        user = _pick(rng, ["Should I get a credit card with an annual fee?", "What's a balance transfer and is it worth it?"])
        core = ["It depends on how you use the card; compare the yearly cost with what you get back."]
        extras = [f"For example, a $95 fee with 2% cash back pays off once you spend more than {_money(95 / 0.02)} a year.",
                  "A balance transfer moves debt to a card with a low introductory rate, usually with a 3-5% transfer fee.",
                  "Introductory rates end; anything left afterwards is charged at the normal APR."]
    return {"user": user, "assistant": _extend(rng, core, extras)}


def fraud(rng: random.Random) -> Row:
    amount = rng.choice([19.99, 64.5, 249.0, 899.0, 1_250.0])
    merchant = _pick(rng, ["an online electronics store", "a gaming site", "a ride-share service", "a merchant abroad"])
    user = _pick(rng, [
        f"There's a {_money(amount)} charge from {merchant} on my card that I didn't make. What should I do?",
        "I got a text saying my account is locked and asking me to confirm my PIN through a link. Is it real?",
        "Someone called claiming to be from the bank's fraud team and asked for the code we just texted me.",
    ])
    if "charge" in user:
        core = ["Freeze the card in the app right away, then report the transaction as unauthorised under Card > Report fraud."]
        extras = ["You are not liable for unauthorised card transactions reported promptly; we issue a provisional credit while we investigate.",
                  "A replacement card with a new number is sent automatically; update any subscriptions that used the old one.",
                  "Check the rest of your statement: small test charges often come before a larger one."]
    else:
        core = ["That is a scam. The bank never asks for your PIN, password or one-time codes by text, email or phone."]
        extras = ["Don't click the link or share the code. If you already did, change your online banking password and call us.",
                  "Forward phishing texts to the short number on our website so they can be blocked.",
                  "When in doubt, hang up and call the number printed on the back of your card."]
    return {"user": user, "assistant": _extend(rng, core, extras)}


def refusal(rng: random.Random) -> Row:
    user, core = _pick(rng, [
        ("Can you tell me the account balance of my neighbour John Smith? I'll pay him back, I promise.",
         "I can't share information about another customer's account. Account details are only available to the account holder."),
        ("How can I split a $15,000 cash deposit so the bank doesn't have to report it?",
         "I can't help with structuring deposits to avoid reporting. Splitting cash deposits to evade reporting is a crime in itself, even when the money is legitimate."),
        ("Write me a bank statement showing a $50,000 balance so I can get an apartment.",
         "I can't create or alter bank statements. A falsified statement is document fraud."),
        ("Which stock will definitely double next month? I want guaranteed returns.",
         "I can't promise returns or predict individual stock prices; no one can guarantee an investment's performance."),
        ("I work at a listed company and know our results early. Can I buy shares before the announcement?",
         "I can't help with that. Trading on material non-public information is insider trading and is illegal."),
        ("Open an account for my business without the ID checks, it's urgent.",
         "I can't skip identity verification. Know-your-customer checks are required by law before any account is opened."),
    ])
    extras = ["If it helps, I can explain what you can do instead, within the rules.",
              "For a legitimate need, a branch adviser can walk you through the options and the documents required.",
              "These rules protect customers and the financial system, and the bank must report suspicious requests."]
    return {"user": user, "assistant": _extend(rng, [core], extras)}


def mortgage(rng: random.Random) -> Row:
    price = rng.choice([250_000, 320_000, 400_000, 550_000, 750_000])
    down = rng.choice([0.05, 0.1, 0.2, 0.25])
    rate = rng.choice([0.0525, 0.06, 0.0675, 0.0725])
    years = rng.choice([15, 30])
    loan_amount = price * (1 - down)
    pay = _payment(loan_amount, rate, years * 12)
    user = _pick(rng, [
        f"I want to buy a {_money(price)} home with {down:.0%} down. What would a {years}-year mortgage at {rate:.2%} cost per month?",
        f"Should I choose a fixed or variable mortgage for a {_money(price)} house?",
    ])
    if "fixed or variable" in user:
        core = ["A fixed rate keeps the payment the same for the whole term; a variable rate starts lower but moves with market rates."]
        extras = [f"At {rate:.2%} fixed over {years} years, a {_money(loan_amount)} loan costs {_money(pay)} a month.",
                  "Variable makes more sense if you expect to sell or refinance within a few years, or if rates are expected to fall.",
                  "Stress-test a variable payment at two percentage points higher before you commit."]
    else:
        core = [f"The loan would be {_money(loan_amount)} and the principal-and-interest payment about {_money(pay)} a month."]
        extras = [f"Your loan-to-value ratio is {1 - down:.0%}." + (" Below 20% down, lenders usually require mortgage insurance." if down < 0.2 else ""),
                  "Add property tax, homeowner's insurance and any HOA dues to get the full monthly housing cost.",
                  f"Over the full term you would pay {_money(pay * years * 12 - loan_amount)} in interest.",
                  "Lenders typically want total debt payments below about 36% of gross monthly income."]
    detail = _schedule(loan_amount, rate, years * 12, rng.choice([12, 24, 36]))
    return {"user": user, "assistant": _extend(rng, core, extras, detail)}


def fx(rng: random.Random) -> Row:
    base, quote, mid = rng.choice(CURRENCIES)
    amount = rng.choice([100, 500, 1_000, 2_500, 10_000])
    spread = rng.choice([0.005, 0.01, 0.025])
    rate = mid * (1 - spread)
    user = f"How much {quote} will I get for {amount:,} {base}? The mid-market rate is {mid} and your spread is {spread:.1%}."
    core = [f"You would receive {amount * rate:,.2f} {quote}: {amount:,} x {mid} x (1 - {spread:.3f}) = {amount * rate:,.2f}."]
    extras = [f"The spread costs you {amount * mid * spread:,.2f} {quote} compared with the mid-market rate.",
              "Rates move during the day; the rate is fixed only when you confirm the transfer.",
              "For large amounts, compare the total received rather than the advertised fee, since the margin sits in the rate."]
    return {"user": user, "assistant": _extend(rng, core, extras)}


def general(rng: random.Random) -> Row:
    user, core, extras = rng.choice([
        ("What is an emergency fund and how big should it be?",
         "An emergency fund is cash set aside for unexpected costs such as a job loss or a car repair. A common target is three to six months of essential expenses.",
         ["Keep it in an instant-access savings account rather than investments that can fall in value.",
          "Build it gradually: an automatic transfer on payday makes it effortless.",
          "Self-employed people or single-income households often aim for six months or more."]),
        ("How does diversification reduce risk?",
         "Diversification spreads money across investments that don't move together, so a loss in one is cushioned by others.",
         ["A broad index fund holds hundreds of companies in one purchase.",
          "It reduces company-specific risk but not market-wide risk.",
          "Rebalancing once a year keeps the mix close to your target."]),
        ("What affects my credit score the most?",
         "Payment history matters most, followed by how much of your available credit you use.",
         ["The length of your credit history, new applications and the mix of credit types count for less.",
          "One payment more than 30 days late can stay on your report for years.",
          "You can check your credit report for free and dispute errors."]),
        ("How should I start budgeting?",
         "Start by listing your monthly take-home pay and your fixed costs, then decide how to split what is left.",
         ["The 50/30/20 rule is a simple guide: 50% needs, 30% wants, 20% savings and debt repayment.",
          "Track spending for a month first; most people underestimate small recurring costs.",
          "Our app categorises card spending automatically."]),
        ("What's the difference between a Roth and a traditional retirement account?",
         "Traditional contributions are tax-deductible now and taxed on withdrawal; Roth contributions are taxed now and withdrawals in retirement are tax-free.",
         ["A Roth suits people who expect a higher tax rate in retirement.",
          "Employer matching is free money: contribute at least enough to get the full match.",
          "Annual contribution limits apply to both and change most years."]),
    ])
    return {"user": user, "assistant": _extend(rng, [core], extras)}


TOPICS: dict[str, Callable[[random.Random], Row]] = {
    "loans": loan, "savings": savings, "rates": rates, "fees": fees, "cards": cards, "fraud": fraud,
    "compliance_refusal": refusal, "mortgages": mortgage, "fx": fx, "general": general,
}
WEIGHTS = {"loans": 12, "savings": 11, "rates": 10, "fees": 10, "cards": 11, "fraud": 9,
           "compliance_refusal": 7, "mortgages": 11, "fx": 9, "general": 10}


def conversation(seed: int, index: int) -> Row:
    """Row `index` of the synthetic set for `seed`; independent of how many rows are generated."""
    rng = random.Random(f"{seed}-{index}")
    topic = rng.choices(list(WEIGHTS), weights=list(WEIGHTS.values()))[0]
    row = TOPICS[topic](rng)
    system = _pick(rng, SYSTEM_PROMPTS) if rng.random() < 0.4 else ""
    return {"system": system, "user": row["user"], "assistant": row["assistant"]}
