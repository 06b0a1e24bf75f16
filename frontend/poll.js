// A page's one polling loop. `round` runs; only once it has finished is the next one scheduled,
// after the milliseconds it returns, so a slow service gets fewer requests, never a pile-up; null: stop (the
// page is going away).

export function poll(round, fallbackMs) {
  const tick = async () => {
    let delay = fallbackMs;
    try {
      delay = await round();
    } catch (error) {
      console.error(error); // a bug in a renderer: keep the page alive, try again
    }
    if (delay !== null) setTimeout(tick, delay);
  };
  tick();
}
