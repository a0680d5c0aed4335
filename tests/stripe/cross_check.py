"""Stripe's own library on either side of our webhook signature: it signs a body for our
webhook to verify, and verifies a header our signer made.

    cross_check.py sign SECRET     < body    prints the Stripe-Signature header Stripe's
                                             library makes for the body
    cross_check.py verify SECRET   < {"body": ..., "header": ...}
                                             exit 0 when Stripe's library accepts the header
                                             for the body (tolerance 300 s), 1 when it refuses
"""

import json
import sys

import stripe


def main() -> int:
    mode, secret = sys.argv[1], sys.argv[2]
    data = sys.stdin.read()
    if mode == "sign":
        print(stripe.WebhookSignature.generate_signature_header(data, secret))
        return 0
    if mode == "verify":
        given = json.loads(data)
        try:
            stripe.WebhookSignature.verify_header(given["body"], given["header"], secret, 300)
        except stripe.SignatureVerificationError as refused:
            print(f"refused: {refused}", file=sys.stderr)
            return 1
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
