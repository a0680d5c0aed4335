// Paying by card at Stripe, with Stripe.js: the pay answer's client secret is confirmed with
// the card the buyer types into Stripe's own card Element, so the number reaches neither this
// page's code nor the shop's server. Stripe.js is loaded from the answer's `jsUrl` when a
// payment needs it (the page's Content-Security-Policy allows that origin only when the shop
// takes payments with Stripe).
//
// Nothing here marks anything paid: the order is paid when Stripe's signed event reaches the
// server, and buyer.js then waits for orders/me to say so.

import { say } from "./api.js";
import { render } from "./render.js";
import { $, state } from "./state.js";

// Where a PaymentIntent stands once Stripe has taken the card: paid, or settling (the event
// follows either way). Any other status is a refusal the buyer may retry.
const TAKEN = ["succeeded", "processing"];
// The one load of Stripe.js: a promise of its `Stripe` function.
let loading = null;
// One Stripe object per publishable key, made at the first payment.
const stripes = new Map();
// The card form while it is open: {stripe, card, clientSecret, done}.
let open = null;

function loadStripeJs(url) {
  if (!loading) {
    loading = new Promise((resolve, reject) => {
      const script = document.createElement("script");
      script.src = url;
      script.onload = () =>
        typeof window.Stripe === "function"
          ? resolve(window.Stripe)
          : reject(new Error(`${url} did not define Stripe`));
      script.onerror = () => reject(new Error(`${url} could not be loaded`));
      document.head.appendChild(script);
    });
    // A failed load is tried again at the next press.
    loading.catch(() => (loading = null));
  }
  return loading;
}

// Opens the card form for the payment `p` (a pay answer with `clientSecret`). Resolves true
// once Stripe.js has confirmed the payment with the buyer's card, false when the form closes
// without that (the order cancelled, another payment started, signed out).
export async function payByCard(p) {
  if (!p.publishableKey || !p.jsUrl) {
    say("This page cannot take the card: the shop has no Stripe publishable key set. Nothing was charged.", "refusal");
    return false;
  }
  let Stripe;
  try {
    Stripe = await loadStripeJs(p.jsUrl);
  } catch (e) {
    say("The card form could not be loaded. Nothing was charged; try again.", "refusal");
    return false;
  }
  closeCard(false);
  if (!stripes.has(p.publishableKey)) stripes.set(p.publishableKey, Stripe(p.publishableKey));
  const stripe = stripes.get(p.publishableKey);
  const card = stripe.elements().create("card");
  $("card-error").textContent = "";
  card.mount("#card-element");
  say("Enter your card to pay.");
  return new Promise((done) => {
    open = { stripe, card, clientSecret: p.clientSecret, done };
    state.card = { amountMinor: p.amountMinor, currency: p.currency };
    render();
  });
}

// The card form's submit: Stripe.js confirms the payment with the card. Its refusal (a declined
// card, a failed authentication, a payment cancelled meanwhile) is shown, and the buyer may try
// again; nothing is marked paid here either way.
export async function confirmCard(event) {
  event.preventDefault();
  if (!open || state.acting) return;
  const { stripe, card, clientSecret } = open;
  state.acting = true;
  $("card-error").textContent = "";
  render();
  let result;
  try {
    result = await stripe.confirmCardPayment(clientSecret, { payment_method: { card } });
  } catch (e) {
    result = { error: e };
  }
  state.acting = false;
  const intent = result && !result.error && result.paymentIntent;
  if (intent && TAKEN.includes(intent.status)) {
    closeCard(true);
    return;
  }
  const error = (result && result.error) || (intent && intent.last_payment_error) || {};
  const why = error.message || (intent ? `the payment is ${intent.status}` : "no answer from Stripe");
  $("card-error").textContent = `The card payment did not go through: ${why}`;
  render();
}

// Closes the card form, if open; `paid` is what payByCard resolves to.
export function closeCard(paid = false) {
  if (!open) return;
  const { card, done } = open;
  open = null;
  state.card = null;
  card.destroy();
  done(paid);
  render();
}
