"""A labelled redaction set: real-format positives and look-alike negatives.

Positives carry valid checksums (resident IDs: ISO 7064 mod 11-2; cards: Luhn). Negatives are
what a naive regex would catch: IDs with a wrong check digit or impossible birth date, order and
tracking numbers, Luhn-invalid card-length numbers, landlines, timestamps, e-mail-like strings.
"""

from __future__ import annotations

from solutions.rag.redact import RedactionCase

CASES: tuple[RedactionCase, ...] = (
    # -- resident IDs
    RedactionCase("身份证号：11010519491231002X，请核对。", {"cn_id": 1}),
    RedactionCase("ID 440304198507153218 belongs to the applicant.", {"cn_id": 1}),
    RedactionCase("客户证件310115199003071239已登记；联系人证件510108197811204567。", {"cn_id": 2}),
    RedactionCase("lower-case check digit: 11010519491231002x", {"cn_id": 1}),
    RedactionCase("校验位错误的证件号 110105194912310021 不应被替换。", {}),
    RedactionCase("impossible birth date 440304198513153218 stays", {}),
    RedactionCase("订单号 202311150000123456 已发货", {}),
    RedactionCase("19-digit serial 4403041985071532181 is not an ID", {}),
    # -- bank cards
    RedactionCase("银行卡 6217001234567890122 尾号0122。", {"bank_card": 1}),
    RedactionCase("Card: 4111 1111 1111 1111, exp 12/29", {"bank_card": 1}),
    RedactionCase("MasterCard 5500-1234-5678-9019 was charged", {"bank_card": 1}),
    RedactionCase("Amex 378282246310005 on file", {"bank_card": 1}),
    RedactionCase("卡号6225880123456789017，开户行招商银行", {"bank_card": 1}),
    RedactionCase("Luhn-invalid 4111111111111112 is an order number", {}),
    RedactionCase("tracking number 1234567890123 (13 digits, starts with 1)", {}),
    RedactionCase("订单编号 6217001234567890123 校验失败", {}),
    RedactionCase("invoice 5500123456789018 rejected", {}),
    RedactionCase("all zeros 0000000000000000 is not a card", {}),
    # -- mobiles
    RedactionCase("联系电话 13812345678，周一至周五。", {"mobile": 1}),
    RedactionCase("call +86 139-1234-5678 or 0086 15012345678", {"mobile": 2}),
    RedactionCase("手机：186 1234 5678", {"mobile": 1}),
    RedactionCase("座机 010-62345678 不是手机", {}),
    RedactionCase("12345678901 starts with 12, not a mobile prefix", {}),
    RedactionCase("timestamp 1700000000123 in milliseconds", {}),
    # -- e-mails
    RedactionCase("Contact jane.doe@example.com for access.", {"email": 1}),
    RedactionCase("邮箱：zhang_san+kb@corp.example.cn；抄送 li.si@mail.example.org", {"email": 2}),
    RedactionCase("not an e-mail: user@localhost or @handle", {}),
    RedactionCase("version string pkg@1.2.3 is not an address", {}),
    # -- mixed
    RedactionCase(
        "客户张三，身份证440304198507153218，手机13912345678，卡号6217001234567890122，邮箱zs@example.com。",
        {"cn_id": 1, "mobile": 1, "bank_card": 1, "email": 1},
    ),
)
