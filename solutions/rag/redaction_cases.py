"""A labelled redaction set: personal data in realistic sentences, and look-alikes that must survive.

Half the cases hold personal data: resident IDs (contiguous, grouped ``110105 19900307 8879``,
full-width digits, glued to letters, lower-case ``x``), mobiles (contiguous, ``139.1234.5678``,
``139-1234-5678``, ``+86 139 1234 5678``, ``0086``, ``(+86)``, full-width), bank cards of every
network, grouped and contiguous, and card-worded numbers outside the network prefixes, and e-mail
addresses. The other half are near-misses a naive pattern takes: Luhn-valid 18-digit order
numbers, Chinese EAN-13 barcodes (many Luhn-valid too), millisecond timestamps, landlines, 400
numbers, version strings, IDs with a wrong check digit or an impossible date, Luhn-invalid card
numbers, card-prefixed numbers named as invoices or orders, e-mail-like strings.

The values are made here from their own format rules (check digits computed by this module, not
by the redactor), from a fixed seed, so the set is the same on every run.
"""

from __future__ import annotations

import datetime as dt
import random

from solutions.rag.redact import RedactionCase

_ID_WEIGHTS = (7, 9, 10, 5, 8, 4, 2, 1, 6, 3, 7, 9, 10, 5, 8, 4, 2)
_REGIONS = ("110105", "310115", "440304", "510108", "330106", "420102", "320582", "370202", "610113", "500103")
_FULL = str.maketrans("0123456789X", "０１２３４５６７８９Ｘ")


def id_check_char(first17: str) -> str:
    """ISO 7064 mod 11-2 check character of the first 17 digits of a resident ID."""
    return "10X98765432"[sum(int(d) * w for d, w in zip(first17, _ID_WEIGHTS, strict=True)) % 11]


def luhn_digit(body: str) -> str:
    """The digit that makes ``body + digit`` Luhn valid."""
    total = 0
    for i, ch in enumerate(reversed(body)):
        d = int(ch)
        if i % 2 == 0:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return str((10 - total % 10) % 10)


def luhn_ok(number: str) -> bool:
    return luhn_digit(number[:-1]) == number[-1]


def ean13_digit(body: str) -> str:
    """EAN-13 check digit of 12 digits (weights 1, 3)."""
    return str((10 - sum(int(d) * (3 if i % 2 else 1) for i, d in enumerate(body)) % 10) % 10)


def make_id(rng: random.Random, check_ok: bool = True, date_ok: bool = True) -> str:
    """A resident ID: a real region code, a birth date 1940-2005, a sequence, its check character."""
    birth = dt.date(1940, 1, 1) + dt.timedelta(days=rng.randrange(365 * 65))
    date = birth.strftime("%Y%m%d") if date_ok else f"{birth.year}{rng.choice(['13', '00', '14'])}{birth.day:02d}"
    body = rng.choice(_REGIONS) + date + f"{rng.randrange(1000):03d}"
    check = id_check_char(body)
    if not check_ok:
        check = rng.choice([c for c in "0123456789" if c != check])
    return body + check


def make_card(rng: random.Random, prefix: str, length: int, valid: bool = True) -> str:
    body = prefix + "".join(str(rng.randrange(10)) for _ in range(length - len(prefix) - 1))
    digit = luhn_digit(body)
    if not valid:
        digit = str((int(digit) + rng.randrange(1, 10)) % 10)
    return body + digit


def make_mobile(rng: random.Random) -> str:
    return "1" + rng.choice("3456789") + "".join(str(rng.randrange(10)) for _ in range(9))


def luhn_valid_number(rng: random.Random, length: int, first: str) -> str:
    return make_card(rng, first, length)


def _group(number: str, sizes: tuple[int, ...], sep: str) -> str:
    out, i = [], 0
    for n in sizes:
        out.append(number[i : i + n])
        i += n
    if i < len(number):
        out.append(number[i:])
    return sep.join(out)


def _positives(rng: random.Random) -> list[RedactionCase]:
    cases: list[RedactionCase] = []

    def add(text: str, group: str, **expected: int) -> None:
        cases.append(RedactionCase(text, expected, group))

    # resident IDs: 30
    id_templates = (
        "申请人身份证号：{v}，请核对后签字。", "The applicant's resident ID is {v}; keep a copy on file.",
        "客户证件号码{v}已完成实名认证。", "经办人（身份证 {v}）于今日到柜台办理。", "Patient ID card: {v} (verified).",
    )
    for _ in range(10):
        add(rng.choice(id_templates).format(v=make_id(rng)), "cn_id", cn_id=1)
    for _ in range(5):
        v = make_id(rng)
        add(f"身份证号 {_group(v, (6, 8), ' ')} 与户口本一致。", "cn_id:spaced", cn_id=1)
    for _ in range(3):
        v = make_id(rng)
        add(f"ID no. {_group(v, (6, 8), '-')} on the form", "cn_id:dashed", cn_id=1)
    for _ in range(4):
        add(f"证件号码：{make_id(rng).translate(_FULL)}，有效期长期。", "cn_id:fullwidth", cn_id=1)
    for _ in range(4):
        add(rng.choice(("RecordID{v} updated", "申请编号A{v}B", "cust_id={v}&step=2", "ID{v}")).format(v=make_id(rng)),
            "cn_id:glued", cn_id=1)
    while sum(1 for c in cases if c.group.startswith("cn_id")) < 30:
        v = make_id(rng)
        if v.endswith("X"):
            add(f"身份证 {v.lower()} 末位为小写 x。", "cn_id:lower-x", cn_id=1)
        elif sum(1 for c in cases if c.group == "cn_id:two") < 2:
            add(f"夫妻双方证件{v}与{make_id(rng)}均已登记。", "cn_id:two", cn_id=2)

    # mobiles: 30
    mobile_forms = (
        ("联系电话 {m}，工作日可打。", lambda m: m), ("请拨打 {m} 联系值班工程师。", lambda m: f"{m[:3]}-{m[3:7]}-{m[7:]}"),
        ("Call {m} after 6 pm.", lambda m: f"{m[:3]}.{m[3:7]}.{m[7:]}"), ("手机：{m}", lambda m: f"{m[:3]} {m[3:7]} {m[7:]}"),
        ("WhatsApp {m} for the site visit.", lambda m: f"+86 {m[:3]} {m[3:7]} {m[7:]}"),
        ("from abroad dial {m}", lambda m: f"0086 {m}"), ("紧急联系人 {m}", lambda m: f"(+86){m}"),
        ("联系方式：{m}（微信同号）", lambda m: m.translate(_FULL)), ("Tel{m} ext none", lambda m: m),
        ("+86-{m} is the hotline", lambda m: f"{m[:3]}-{m[3:7]}-{m[7:]}"),
    )
    for i in range(27):
        template, form = mobile_forms[i % len(mobile_forms)]
        add(template.format(m=form(make_mobile(rng))), "mobile", mobile=1)
    for _ in range(3):
        add(f"店长 {make_mobile(rng)}，副店长 {make_mobile(rng)}。", "mobile:two", mobile=2)

    # bank cards: 40
    networks = (("4", 16, "visa"), ("51", 16, "mastercard"), ("55", 16, "mastercard"), ("2223", 16, "mastercard-2"),
                ("622588", 16, "unionpay"), ("621700", 19, "unionpay-19"), ("6222", 19, "unionpay-19"),
                ("3530", 16, "jcb"), ("6011", 16, "discover"), ("4", 19, "visa-19"))
    card_templates = ("银行卡 {c} 尾号需核对。", "Charged to {c} yesterday.", "退款将原路退回至 {c}。",
                      "The refund goes back to {c}.", "请于月底前还款，卡片 {c}。")
    for i in range(25):
        prefix, length, name = networks[i % len(networks)]
        c = make_card(rng, prefix, length)
        shown = c if i % 3 == 0 else _group(c, (4, 4, 4, 4), " " if i % 3 == 1 else "-")
        add(rng.choice(card_templates).format(c=shown), f"bank_card:{name}", bank_card=1)
    for _ in range(4):
        c = make_card(rng, rng.choice(("34", "37")), 15)
        add(f"Amex {_group(c, (4, 6), ' ')} on file", "bank_card:amex", bank_card=1)
    for _ in range(3):
        c = make_card(rng, "34", 15)
        add(f"AMEX card {c} expires 09/27", "bank_card:amex", bank_card=1)
    for _ in range(5):  # outside the network prefixes, but named as a card or account
        c = make_card(rng, rng.choice(("9558", "6013", "8888")), rng.choice((16, 19)))
        add(rng.choice(("工资卡号{c}，开户行工商银行。", "借记卡 {c} 已冻结", "card number {c}")).format(c=c),
            "bank_card:context", bank_card=1)
    for _ in range(3):
        add(f"卡号：{make_card(rng, '6217', 19).translate(_FULL)}", "bank_card:fullwidth", bank_card=1)

    # e-mails: 15
    names = ("jane.doe", "zhang_san+kb", "li.si", "ops-team", "w.wang88", "chen.jing", "a.b.c", "k2")
    domains = ("example.com", "corp.example.cn", "mail.example.org", "example.com.cn", "dept.example.net")
    for i in range(15):
        add(rng.choice(("请发送至 {e} 。", "Contact {e} for access.", "抄送：{e}", "Reply-To: {e}")).format(
            e=f"{names[i % len(names)]}@{domains[i % len(domains)]}"), "email", email=1)

    # mixed: 5
    for _ in range(5):
        add(f"客户王五，身份证{make_id(rng)}，手机{make_mobile(rng)}，卡号{make_card(rng, '6228', 19)}，"
            f"邮箱ww{rng.randrange(100)}@example.com。", "mixed", cn_id=1, mobile=1, bank_card=1, email=1)
    return cases


def _near_misses(rng: random.Random) -> list[RedactionCase]:
    cases: list[RedactionCase] = []

    def add(text: str, group: str) -> None:
        cases.append(RedactionCase(text, {}, group))

    # 18-digit order numbers, Luhn-valid on purpose (what a Luhn-only rule takes for a card)
    for _ in range(10):
        day = dt.date(2022, 1, 1) + dt.timedelta(days=rng.randrange(1000))
        n = luhn_valid_number(rng, 18, day.strftime("%Y%m%d"))
        add(rng.choice(("订单号 {n} 已发货。", "Order {n} shipped today.", "运单 {n} 派送中")).format(n=n),
            "near-miss:order")
    for _ in range(6):
        n = luhn_valid_number(rng, 18, rng.choice("13579"))
        add(rng.choice(("流水号{n}", "交易参考号 {n} 处理完成", "ticket {n} closed")).format(n=n), "near-miss:order")
    for _ in range(4):  # card-prefixed numbers that the text names as something else
        n = make_card(rng, rng.choice(("6225", "4000", "5500")), 16)
        add(rng.choice(("订单编号 {n} 退款中", "invoice {n} rejected", "发票号码：{n}")).format(n=n), "near-miss:named")

    # Chinese EAN-13 barcodes (prefix 690-699), half of them Luhn-valid too
    made = 0
    while made < 16:
        body = "69" + "".join(str(rng.randrange(10)) for _ in range(10))
        code = body + ean13_digit(body)
        if luhn_ok(code) != (made % 2 == 0):
            continue
        add(rng.choice(("商品条码 {c}，规格 500ml。", "EAN {c} scanned at till 3", "货品 {c} 库存 12 件")).format(c=code),
            "near-miss:ean13")
        made += 1

    # timestamps
    for _ in range(8):
        ms = rng.randrange(1_500_000_000_000, 1_800_000_000_000)
        add(rng.choice(("ts={t} in milliseconds", "日志时间戳 {t}", "created_at: {t}")).format(t=ms), "near-miss:timestamp")
    for _ in range(4):
        moment = dt.datetime(2023, 1, 1) + dt.timedelta(seconds=rng.randrange(60_000_000))
        add(f"事件发生于 {moment:%Y-%m-%d %H:%M:%S}，编号 {moment:%Y%m%d%H%M%S}{rng.randrange(1000):03d}", "near-miss:timestamp")

    # landlines and service numbers
    for _ in range(12):
        area, n = rng.choice((("010", 8), ("021", 8), ("0755", 8), ("0571", 8), ("028", 8)))
        digits = str(rng.randrange(2, 9)) + "".join(str(rng.randrange(10)) for _ in range(n - 1))
        form = rng.choice(("{a}-{d}", "({a}) {d}", "{a} {d}", "+86 {a4} {d}"))
        add("座机 " + form.format(a=area, d=digits, a4=area.lstrip("0")) + " 转 8001", "near-miss:landline")
    for _ in range(4):
        add(f"客服热线 400-{rng.randrange(100, 999)}-{rng.randrange(1000, 9999)}", "near-miss:landline")

    # version strings, IPs, build numbers
    for _ in range(10):
        add(rng.choice((
            "upgrade to v{a}.{b}.{c}", "package foo@{a}.{b}.{c} pinned", "build {a}.{b}.{c}.{d} released",
            "server 10.{a}.{b}.{e} is down", "固件版本 V{a}.{b}.{c}.{d}",
        )).format(a=rng.randrange(1, 20), b=rng.randrange(0, 200), c=rng.randrange(1000, 9999),
                  d=rng.randrange(1000, 9999), e=rng.randrange(1, 255)), "near-miss:version")

    # IDs that fail: wrong check character, impossible date
    for _ in range(8):
        add(f"证件号 {make_id(rng, check_ok=False)} 校验失败", "near-miss:id-check")
    for _ in range(6):
        add(f"ID {make_id(rng, date_ok=False)} has no such birth date", "near-miss:id-date")

    # Luhn-invalid card numbers, 11-digit numbers outside mobile prefixes, e-mail look-alikes
    for _ in range(8):
        add(f"卡号 {make_card(rng, '6217', 19, valid=False)} 输入有误", "near-miss:luhn")
    for _ in range(4):
        add(f"编号 1{rng.choice('012')}{rng.randrange(10**8, 10**9)} 不是手机号", "near-miss:not-mobile")
    # other identifiers of the same lengths: company credit codes, IMEIs (Luhn-valid 15 digits), QQ
    alnum = "0123456789ABCDEFGHJKLMNPQRTUWXY"
    for _ in range(6):
        org = "".join(rng.choice(alnum) for _ in range(8)) + rng.choice("ABCDEFGH")
        add(f"统一社会信用代码 91{rng.choice(_REGIONS)}{org}{rng.choice(alnum)}", "near-miss:credit-code")
    for _ in range(8):
        imei = luhn_valid_number(rng, 15, rng.choice(("35", "86", "01")))
        add(rng.choice(("设备 IMEI {n} 已绑定", "IMEI: {n}", "handset {n} registered")).format(n=imei), "near-miss:imei")
    for _ in range(4):
        add(f"QQ {rng.randrange(10**8, 10**10)} 群聊，邮编 {rng.randrange(100000, 999999)}", "near-miss:qq")
    for text in ("not an e-mail: user@localhost or @handle", "version string pkg@1.2.3 is not an address",
                 "git@host paths and name@ alone", "价格 @ 12.5 元/件"):
        add(text, "near-miss:email")
    return cases


def build_cases(seed: int = 17) -> tuple[RedactionCase, ...]:
    """The labelled set (about 120 with personal data, 120 look-alikes), the same for a seed."""
    rng = random.Random(seed)
    return tuple(_positives(rng) + _near_misses(rng))


CASES: tuple[RedactionCase, ...] = build_cases()
