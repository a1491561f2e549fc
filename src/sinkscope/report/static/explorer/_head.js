/* sinkscope attention explorer (heads overview, a head's pattern, the text view).
 *
 * A plain script, no dependencies and nothing fetched: it is inlined into the report page after
 * the explorer sections. Every element with a data-sinkscope-explorer attribute holds its data as
 * JSON in a child <script type="application/json" class="sx-data">; this script builds the UI in
 * that element. The data contract and the block layout are described in
 * src/sinkscope/report/explorer_page.py and src/sinkscope/store/explorer_format.py. The script is
 * joined from static/explorer/*.js in name order, one file per view (explorer_page.explorer_script).
 *
 * Page API: window.sinkscopeExplorer (the first explorer), window.sinkscopeExplorers (all), each
 * with ready, weight(), phantom(), open(), cellCenter(), headCenter(), setZoom(), resetZoom().
 */
(function () {
  "use strict";
