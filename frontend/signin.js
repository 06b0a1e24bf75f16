// The sign-in page (serve --auth; docs/access.md): a read or admin token becomes the session cookie,
// then the browser goes back to the page that was refused (`next`, a path on this service only).
import { signIn, signOut } from "./api.js";
import { say } from "./dom.js";

// `next` as a path of this origin, never another site's address (no open redirect).
function nextPath() {
  const asked = new URLSearchParams(window.location.search).get("next") || "/";
  const target = new URL(asked, window.location.origin);
  if (target.origin !== window.location.origin || target.pathname.startsWith("/signin")) return "/";
  return `${target.pathname}${target.search}${target.hash}`;
}

document.getElementById("signin-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const field = document.getElementById("token");
  say("signin-error", "");
  try {
    await signIn(field.value.trim());
    window.location.assign(nextPath());
  } catch (error) {
    say("signin-error", `Could not sign in: ${error.message}`);
  }
});

document.getElementById("signout").addEventListener("click", async () => {
  try {
    await signOut();
    say("signin-status", "Signed out.");
  } catch (error) {
    say("signin-error", `Could not sign out: ${error.message}`);
  }
});
